"""A generated family of short round-based environments: the Designer's warm-start targets.

The four starter envs teach a small model four fixed programs; sampled at a temperature it mixes
them into code that does not parse, and a copy of one is a ``duplicate`` of the env it copies once
that env is in the memory. This family is one skeleton with three independent choices, each a
change of the program's structure (what ``astnorm`` keeps), not only of its words:

- the rule that turns what the env shows into the answer (``RULES``: reverse a word, name its
  first letter, add two numbers...), with its own material (word lists, number ranges) drawn from
  the seed;
- feedback: a wrong answer is corrected ("No, it is X.") or only marked ("No.");
- scoring: each right answer pays 1/R at once, or the score is paid when the last round ends.

``members(seed)`` returns every combination (``len(RULES) * 4`` envs) with a one-sentence hint
that states the rule. Every member passes ``spade validate`` (tests/test_pool.py runs them all
through it) and none has the structure of a starter env, so the held-out suite stays held out. A
Designer warm-started on the family (``spade warmstart --pool family``) learns the skeleton from
every sample and the choices as its variable parts: sampled, it writes a mix of valid
combinations and broken code (10 of 16 valid after 6 epochs of a 13M model alone; what the
Agent's warm start and the loop then did to it: docs/results.md, "The CPU quickstart").

    envs = members(0)   # [{"name", "title", "code", "hint"}, ...]
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon", "candle",
         "rocket", "garden", "pencil", "forest", "silver", "bridge", "castle", "window", "market",
         "planet", "button", "dragon", "island", "mirror", "basket", "hammer", "jacket", "kitten"]
# lengths 2 to 9 and 0 to 5 vowels, for the rules that count: no one count answers most rounds
COUNTED = ["ox", "sky", "cat", "tree", "bird", "horse", "music", "banana", "orange", "turtle",
           "giraffe", "avocado", "elephant", "umbrella", "education", "kangaroo", "strength", "oatmeal"]


@dataclass(frozen=True)
class Rule:
    name: str         # the title's subject
    ask: str          # the question, an f-string body over the drawn attributes
    draw: str         # the body of draw(): sets the attributes from self.np_random
    want: str         # the answer, an expression over the attributes
    hint: str         # the rule in one sentence
    table: str = ""   # a module-level constant the draw uses ("" for none)
    exact_case: bool = False  # compare without lower-casing the reply


def _words(rng: random.Random, k: int, pool: list[str] = WORDS) -> str:
    return repr(sorted(rng.sample(pool, k)))


def _rules(rng: random.Random) -> list[Rule]:
    lo, hi = rng.choice([(2, 20), (3, 30), (5, 40)])
    w = "str(self.np_random.choice(WORDS))"
    return [
        Rule("Backwards", "Word: {self.w}. Spell it backwards.", f"self.w = {w}", "self.w[::-1]",
             "Reply with the word's letters in reverse order.", f"WORDS = {_words(rng, 8)}"),
        Rule("First letter", "Word: {self.w}. First letter?", f"self.w = {w}", "self.w[0]",
             "Reply with the first letter of the word alone.", f"WORDS = {_words(rng, 8)}"),
        Rule("Last letter", "Word: {self.w}. Last letter?", f"self.w = {w}", "self.w[-1]",
             "Reply with the last letter of the word alone.", f"WORDS = {_words(rng, 8)}"),
        Rule("Word length", "Word: {self.w}. How many letters?", f"self.w = {w}", "str(len(self.w))",
             "Count the letters of the word and reply with the number in digits.",
             f"WORDS = {_words(rng, 10, COUNTED)}"),
        Rule("Shout", "Word: {self.w}. Shout it.", f"self.w = {w}", "self.w.upper()",
             "Reply with the word in capital letters.", f"WORDS = {_words(rng, 8)}", exact_case=True),
        Rule("Sorted letters", "Word: {self.w}. Its letters in order?", f"self.w = {w}",
             '"".join(sorted(self.w))', "Reply with the word's letters sorted from a to z, no spaces.",
             f"WORDS = {_words(rng, 8)}"),
        Rule("Vowels", "Word: {self.w}. How many vowels?", f"self.w = {w}",
             'str(sum(c in "aeiou" for c in self.w))',
             "Count the letters a, e, i, o and u in the word and reply with the number.",
             f"WORDS = {_words(rng, 10, COUNTED)}"),
        Rule("Double", "Number: {self.a}. Double it.", f"self.a = int(self.np_random.integers({lo}, {hi}))",
             "str(2 * self.a)", "Reply with twice the number, in digits."),
        Rule("Sum", "{self.a} plus {self.b}?",
             f"self.a = int(self.np_random.integers({lo}, {hi}))\n"
             f"        self.b = int(self.np_random.integers({lo}, {hi}))",
             "str(self.a + self.b)", "Add the two numbers and reply with the sum in digits."),
        Rule("Difference", "{self.a} minus {self.b}?",
             f"self.b = int(self.np_random.integers({lo}, {hi}))\n"
             f"        self.a = self.b + int(self.np_random.integers({lo}, {hi}))",
             "str(self.a - self.b)", "Subtract the second number from the first and reply in digits."),
        Rule("Product", "{self.a} times {self.b}?",
             "self.a = int(self.np_random.integers(2, 10))\n"
             "        self.b = int(self.np_random.integers(2, 10))",
             "str(self.a * self.b)", "Multiply the two numbers and reply with the product in digits."),
        Rule("Previous letter", "Letter: {LETTERS[self.i]}. Which letter comes before it?",
             "self.i = int(self.np_random.integers(1, 26))", "LETTERS[self.i - 1]",
             "Reply with the letter just before it in the alphabet.", 'LETTERS = "abcdefghijklmnopqrstuvwxyz"'),
        Rule("First in order", "{self.w} or {self.v}: which comes first in a dictionary?",
             f"self.w = {w}\n        self.v = {w}", "min(self.w, self.v)",
             "Reply with whichever word comes first in alphabetical order.", f"WORDS = {_words(rng, 8)}"),
    ]


RULES = [r.name for r in _rules(random.Random(0))]


def _code(rule: Rule, corrected: bool, at_end: bool, rounds: int, cls: str) -> str:
    cmp = "action.strip()" if rule.exact_case else "action.strip().lower()"
    note = 'f"No, it is {want}."' if corrected else '"No."'
    if at_end:  # the score is paid when the last round ends
        start, tally, reward = "\n        self.score = 0", "\n        self.score += ok", \
            f"self.score / {rounds} if self.t == {rounds} else 0.0"
    else:
        start, tally, reward = "", "", f"ok / {rounds}"
    table = f"\n{rule.table}\n" if rule.table else ""
    return f'''import gymnasium as gym
{table}

class {cls}(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0{start}
        self.draw()
        return f"{rule.ask}", {{}}

    def draw(self):
        {rule.draw}

    def step(self, action):
        want = {rule.want}
        ok = {cmp} == want
        note = "Yes." if ok else {note}
        self.t += 1{tally}
        self.draw()
        return f"{{note}} {rule.ask}", {reward}, self.t == {rounds}, False, {{}}
'''


def members(seed: int = 0) -> list[dict]:
    """Every rule x feedback x scoring, with material and round counts drawn from ``seed``."""
    rng = random.Random(f"family|{seed}")
    out = []
    for rule in _rules(rng):
        for corrected in (True, False):
            for at_end in (False, True):
                rounds = rng.choice([3, 4, 5])
                fb = "wrong answers are corrected" if corrected else "wrong answers are marked"
                paid = "paid per round" if not at_end else "paid at the end"
                title = f"{rule.name}: {rounds} rounds, {fb}, {paid}"
                cls = "".join(part.capitalize() for part in rule.name.split())
                hint = rule.hint + (" Wrong answers are corrected, so read each correction."
                                    if corrected else "")
                name = f"{rule.name.lower().replace(' ', '_')}_{'c' if corrected else 'm'}{'e' if at_end else 'r'}"
                out.append({"name": name, "title": title, "hint": hint,
                            "code": _code(rule, corrected, at_end, rounds, cls)})
    return out
