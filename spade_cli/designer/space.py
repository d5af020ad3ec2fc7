"""The design space: a miniature in which a small Designer writes a spec and spade writes the env.

A 13M-parameter model cannot write free-form environments, so the curriculum is tested where it
can act (docs/curriculum.md). In ``spade design --contract spec`` the Designer answers with one
line, e.g. ``Spec: rule=second level=4 rounds=4 feedback=corrected``, and ``compile_spec`` turns
it into the env's code and hint. Everything after design (validate, rollout, regret, memory,
update) sees an ordinary design row, with the parsed spec kept in the row's ``spec`` field.

The space is ``RULES x LEVELS`` cells, with two knobs that change an episode but not its cell:

- ``rule``: what turns the shown material into the answer (a word of a list by its place, the
  word shown twice, a number doubled or plus one). The env shows only a cue word of
  its own (``Blick: river apple``), never the rule: without the hint the Agent must learn what the cue
  asks from the rewards; the hint states the rule;
- ``level`` 1-5, the difficulty knob with a real range: the list's length (2 to 6 words) or the
  number's digit count (1 to 5). Past some level a 13M Agent fails even with the hint;
- ``rounds`` 1-5: rounds per episode, each paying 1/rounds;
- ``feedback``: a wrong answer is ``corrected`` (the env shows the right one) or only ``marked``.

One cell per rule is held out (``HELD_OUT``): a spec naming one is a parse error, so no Designer,
pool or warm start ever trains on it, and ``grid_envs(True)`` builds the suite from exactly those
cells. ``practice_envs`` are the Agent's warm-start envs: every trainable cell with a cue drawn
at random each round, so that only the hint says what to do (the warm start teaches reading a
hint, not the cues).

    env = compile_spec(parse_spec("rule=double level=1"))   # {"name", "title", "code", "hint", "spec"}
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# what a list shows: short common words
WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon", "candle",
         "rocket", "garden", "pencil", "forest", "silver", "bridge"]
LEVELS = (1, 2, 3, 4, 5)
FEEDBACK = ("corrected", "marked")
MAX_ROUNDS = 5
# cue words the real envs show, one per rule; practice envs draw theirs from PRACTICE_CUES
PRACTICE_CUES = ["Zorp", "Mib", "Tove", "Quell", "Vash", "Nork", "Plim", "Drax", "Sulk", "Gobe",
                 "Hux", "Yarn", "Lirp", "Covo", "Jint", "Ruba"]


@dataclass(frozen=True)
class Rule:
    cue: str      # what the env shows in place of the rule
    kind: str     # "list" (level + 1 words) or "number" (level digits): what the level sizes
    want: str     # the answer, an expression over ``m`` (the shown material, a string)
    hint: str     # the rule in one sentence


RULES = {
    "first": Rule("Dax", "list", "m.split()[0]", "Reply with the first word of the list."),
    "last": Rule("Wug", "list", "m.split()[-1]", "Reply with the last word of the list."),
    "second": Rule("Blick", "list", "m.split()[1]", "Reply with the second word of the list."),
    "twice": Rule("Fep", "list", "max(m.split(), key=m.split().count)",
                  "Reply with the word that appears twice in the list."),
    "double": Rule("Toma", "number", "str(2 * int(m))", "Reply with twice the number, in digits."),
    "plus_one": Rule("Kiki", "number", "str(int(m) + 1)", "Reply with the number plus one, in digits."),
}
# one cell per rule, in the middle of its range: the held-out suite (never trained)
HELD_OUT = {("first", 4), ("last", 2), ("second", 3), ("twice", 2), ("double", 2), ("plus_one", 2)}


@dataclass(frozen=True)
class Spec:
    rule: str
    level: int
    rounds: int = 3
    feedback: str = "corrected"

    @property
    def cell(self) -> tuple[str, int]:
        return (self.rule, self.level)

    def text(self) -> str:
        return f"rule={self.rule} level={self.level} rounds={self.rounds} feedback={self.feedback}"


class SpecError(ValueError):
    pass


_PAIR = re.compile(r"([A-Za-z_]+)\s*[=:]\s*([A-Za-z_0-9]+)")


def parse_spec(text: str, *, allow_held_out: bool = False) -> Spec:
    """A spec from ``key=value`` pairs (``:`` also accepted, any order and separators); rule and
    level are required. Anything unknown or out of range is a ``SpecError`` that says what."""
    pairs = {}
    for key, value in _PAIR.findall(text or ""):
        key = key.lower()
        if key in pairs and pairs[key] != value:
            raise SpecError(f"{key} given twice ({pairs[key]}, {value})")
        pairs[key] = value
    unknown = sorted(set(pairs) - {"rule", "level", "rounds", "feedback"})
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r} (keys: rule, level, rounds, feedback)")
    for need in ("rule", "level"):
        if need not in pairs:
            raise SpecError(f"no {need}=")
    rule = pairs["rule"].lower()
    if rule not in RULES:
        raise SpecError(f"unknown rule {rule!r} (rules: {', '.join(RULES)})")
    level = _int(pairs, "level", 1, len(LEVELS))
    rounds = _int(pairs, "rounds", 1, MAX_ROUNDS) if "rounds" in pairs else 3
    feedback = pairs.get("feedback", "corrected").lower()
    if feedback not in FEEDBACK:
        raise SpecError(f"unknown feedback {feedback!r} (feedback: {', '.join(FEEDBACK)})")
    spec = Spec(rule, level, rounds, feedback)
    if spec.cell in HELD_OUT and not allow_held_out:
        raise SpecError(f"rule={rule} level={level} is held out for evaluation")
    return spec


def _int(pairs: dict, key: str, lo: int, hi: int) -> int:
    value = pairs[key]
    if not value.isdigit() or not lo <= int(value) <= hi:
        raise SpecError(f"{key}={value} is not an integer from {lo} to {hi}")
    return int(value)


def material(rule: Rule, level: int) -> str:
    """The module-level constants the env draws from: the word list and its length, or a number range."""
    if rule.kind == "list":
        return f"MATERIAL = {WORDS!r}\nN = {level + 1}"
    return f"MATERIAL = ({10 ** (level - 1) if level > 1 else 1}, {10 ** level})"


_DRAW = {
    "list": "' '.join(str(w) for w in self.np_random.choice(MATERIAL, size=N, replace=False))",
    # N - 1 distinct words, one of them shown a second time at a random place
    "twice": ("[str(w) for w in self.np_random.choice(MATERIAL, size=N - 1, replace=False)]\n"
              "        words.insert(int(self.np_random.integers(0, N)), "
              "words[int(self.np_random.integers(0, N - 1))])\n"
              "        self.m = ' '.join(words)"),
    "number": "str(int(self.np_random.integers(*MATERIAL)))",
}


def _code(spec: Spec, practice: bool) -> str:
    rule = RULES[spec.rule]
    draw = f"words = {_DRAW['twice']}" if spec.rule == "twice" else f"self.m = {_DRAW[rule.kind]}"
    cue = "str(self.np_random.choice(CUES))" if practice else repr(rule.cue)
    cues = f"\nCUES = {PRACTICE_CUES!r}" if practice else ""
    note = 'f"No, it is {want}."' if spec.feedback == "corrected" else '"No."'
    cls = "Practice" if practice else rule.cue
    return f'''import gymnasium as gym

{material(rule, spec.level)}{cues}


class {cls}(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.draw()
        return f"{{self.cue}}: {{self.m}}", {{}}

    def draw(self):
        {draw}
        self.cue = {cue}

    def step(self, action):
        m = self.m
        want = {rule.want}
        ok = action.strip().lower() == want
        note = "Yes." if ok else {note}
        self.t += 1
        self.draw()
        return f"{{note}} {{self.cue}}: {{self.m}}", ok / {spec.rounds}, self.t == {spec.rounds}, False, {{}}
'''


def compile_spec(spec: Spec, *, practice: bool = False) -> dict:
    """The env of a spec: ``{name, title, code, hint, spec}`` (``spec`` a plain dict)."""
    rule = RULES[spec.rule]
    size = f"{spec.level + 1} words" if rule.kind == "list" else f"{spec.level} digits"
    name = f"{'practice_' if practice else ''}{spec.rule}_{spec.level}"
    title = f"{rule.cue}: {spec.rule} of {size}, {spec.rounds} rounds, {spec.feedback}"
    return {"name": name, "title": title, "code": _code(spec, practice), "hint": rule.hint,
            "spec": asdict(spec)}


def format_spec(spec: Spec) -> str:
    """A Designer's answer in the format ``--contract spec`` asks for (warm-start targets)."""
    return f"Spec: {spec.text()}\n"


def cells(held_out: bool | None = False) -> list[tuple[str, int]]:
    """The cells in a fixed order: trainable ones (False), held-out ones (True) or all (None)."""
    return [(r, lv) for r in RULES for lv in LEVELS if held_out is None or ((r, lv) in HELD_OUT) == held_out]


def grid_envs(held_out: bool | None = False, rounds: int = 3, feedback: str = "corrected") -> list[dict]:
    """One env per cell: the uniform static pool (trainable cells), the held-out suite, the probe grid."""
    return [compile_spec(Spec(r, lv, rounds, feedback)) for r, lv in cells(held_out)]


def practice_envs() -> list[dict]:
    """The Agent's warm-start envs: every trainable cell, the cue drawn per round (see above)."""
    return [compile_spec(Spec(r, lv), practice=True) for r, lv in cells(False)]


def solve(observation: str, rule: str) -> str | None:
    """The right reply to the latest ``Cue: material`` in an observation, or None."""
    found = re.search(r"[A-Z][a-z]+: ([a-z0-9 ]+)$", observation.strip())
    return ANSWERS[rule](found.group(1)) if found else None


# the rules again as Python, for the scripted solver; tests/test_space.py plays every env with it
ANSWERS = {"first": lambda m: m.split()[0], "last": lambda m: m.split()[-1], "second": lambda m: m.split()[1],
           "twice": lambda m: max(m.split(), key=m.split().count), "double": lambda m: str(2 * int(m)),
           "plus_one": lambda m: str(int(m) + 1)}
