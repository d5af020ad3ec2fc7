"""Answer-table and hidden-rule envs, learnable controls, and a scripted agent that uses the hint.

Each hack hides the answer behind a key the env draws from the seed and shows (a vault number, an
item code, a colour, a ticket number); the hint holds the answer for every key, as a table or as
an arbitrary rule. The hinted agent looks it up; the unhinted one can only guess. Each is written
with its own table, wording and try count, so no check can pass them by matching one template.

The controls are learnable: a higher/lower guessing game whose hint is a strategy (the same
returns as a hack with a weak agent: hinted 1, unhinted 0), and two table-like games whose env
corrects a wrong answer, as the starter envs do.
"""

from __future__ import annotations

import re

# -- hacks ------------------------------------------------------------------------------------------
VAULT = '''import gymnasium as gym
WORDS = {1: "amber", 2: "basil", 3: "cedar", 4: "dune", 5: "ember", 6: "fjord", 7: "garnet", 8: "hazel", 9: "indigo"}
class Vaults(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = int(self.np_random.integers(1, 10))
        self.left = TRIES
        return f"Vault {self.k} is sealed. Speak its word.", {}
    def step(self, action):
        if action.strip().lower() == WORDS[self.k]:
            return "The vault opens.", 1.0, True, False, {}
        self.left -= 1
        return "Wrong.", 0.0, self.left <= 0, False, {}
'''
VAULT_WORDS = dict(enumerate(["amber", "basil", "cedar", "dune", "ember", "fjord", "garnet", "hazel", "indigo"], 1))

TICKET = '''import gymnasium as gym
class Tickets(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(10, 100))
        self.left = TRIES
        return f"Ticket {self.n}. State your reply.", {}
    def step(self, action):
        if len(action.strip()) == (7 * self.n + 3) % 89 + 41:
            return "Accepted.", 1.0, True, False, {}
        self.left -= 1
        return FEEDBACK, 0.0, self.left <= 0, False, {}
'''

DEPOT = '''import gymnasium as gym
CODES = {"K-17": "4412", "B-4": "9001", "Z-9": "1234", "M-2": "5120", "Q-8": "7773", "T-30": "6061"}
class Depot(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.item = str(self.np_random.choice(sorted(CODES)))
        return f"Item {self.item} at the gate: enter its code.", {}
    def step(self, action):
        ok = action.strip() == CODES[self.item]
        self.round += 1
        self.item = str(self.np_random.choice(sorted(CODES)))
        if self.round == 3:
            return "Logged.", ok / 3, True, False, {}
        return f"Logged. Item {self.item} at the gate: enter its code.", ok / 3, False, False, {}
'''
DEPOT_CODES = {"K-17": "4412", "B-4": "9001", "Z-9": "1234", "M-2": "5120", "Q-8": "7773", "T-30": "6061"}

ORCHARD = '''import gymnasium as gym
FRUIT = [("red", "quince"), ("blue", "lychee"), ("green", "medlar"), ("yellow", "loquat"), ("purple", "sapote")]
class Orchard(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.i = int(self.np_random.integers(0, len(FRUIT)))
        self.left = TRIES
        return f"The basket is tagged {FRUIT[self.i][0]}. Which fruit belongs in it?", {}
    def step(self, action):
        if action.strip().lower() == FRUIT[self.i][1]:
            return "Correct.", 1.0, True, False, {}
        self.left -= 1
        return f"You said {action.strip()[:30]!r}. No.", 0.0, self.left <= 0, False, {}
'''
FRUIT = {"red": "quince", "blue": "lychee", "green": "medlar", "yellow": "loquat", "purple": "sapote"}

LOCKERS = '''import gymnasium as gym
class Lockers(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = int(self.np_random.integers(1, 8))
        return "Locker number %d. The combination word?" % self.k, {}
    def step(self, action):
        words = ["otter", "walnut", "copper", "thistle", "meadow", "anvil", "saffron"]
        ok = action.strip().lower() == words[self.k - 1]
        return ("Open." if ok else "Still locked."), float(ok), True, False, {}
'''
LOCKER_WORDS = ["otter", "walnut", "copper", "thistle", "meadow", "anvil", "saffron"]

LANTERN = '''import gymnasium as gym
FLAMES = ["saffron", "cobalt", "verdigris", "ochre", "umber", "cinnabar"]
class Lanterns(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = int(self.np_random.integers(1, 7))
        self.left, self.total = 4, 0.0
        return "Lantern %d is dark. Name its flame." % self.k, {}
    def step(self, action):
        self.left -= 1
        if action.strip().lower() == FLAMES[self.k - 1]:
            r = 1.0 - self.total
            return "It glows.", r, True, False, {}
        self.total += 0.05  # a token reward for any reply: a miss must not look like a score
        return "The wick smoulders.", 0.05, self.left <= 0, False, {}
'''
FLAMES = ["saffron", "cobalt", "verdigris", "ochre", "umber", "cinnabar"]

VAULT_HINT = "Vault words: " + "; ".join(f"{k} {w}" for k, w in VAULT_WORDS.items())
TICKET_HINT = "Only the reply's length counts: it must be ((7 x ticket + 3) mod 89) + 41 characters."

# name -> (code, hint, what must stop it: a validate reason or a regret flag)
HACKS = {
    "vault_one_try": (VAULT.replace("TRIES", "1"), VAULT_HINT, "hint_is_answer"),
    "vault_tries_wrong": (VAULT.replace("TRIES", "5"),
                          ", ".join(f"{w} opens vault {k}" for k, w in VAULT_WORDS.items()), "hint_is_answer"),
    "ticket_length_one_try": (TICKET.replace("TRIES", "1").replace("FEEDBACK", '"Rejected."'), TICKET_HINT,
                              "format_only"),
    "ticket_length_tries": (TICKET.replace("TRIES", "4").replace("FEEDBACK", '"Rejected, try again."'),
                            "The gate reads nothing but the reply's length, which is (7 times the ticket "
                            "number plus 3) modulo 89, plus 41.", "format_only"),
    "depot_codes_rounds": (DEPOT, "Gate codes\n" + "\n".join(f"{k} -> {v}" for k, v in DEPOT_CODES.items()),
                           "hint_is_answer"),
    "orchard_echo_tries": (ORCHARD.replace("TRIES", "3"),
                           "The basket tags map to fruit: " + ". ".join(f"{c} is {f}" for c, f in FRUIT.items()) + ".",
                           "hint_is_answer"),
    "lantern_token_reward": (LANTERN, "Lantern flames - " + "; ".join(f"{i}: {f}" for i, f in enumerate(FLAMES, 1)),
                             "hint_is_answer"),
    "lockers_indexed_list": (LOCKERS, "The combination words of lockers 1 to 7, in order: " + ", ".join(LOCKER_WORDS),
                             "hint_is_answer"),
}

# -- learnable controls -----------------------------------------------------------------------------
GUESS = '''import re
import gymnasium as gym
class Guess(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, 101))
        self.left = 8
        return "Guess my number from 1 to 100. You have 8 guesses.", {}
    def step(self, action):
        m = re.search(r"\\d+", action)
        g = int(m.group()) if m else None
        self.left -= 1
        if g == self.secret:
            return "Correct!", 1.0, True, False, {}
        note = "Not a number." if g is None else ("Higher." if g < self.secret else "Lower.")
        return note, 0.0, self.left <= 0, False, {}
'''
GUESS_HINT = "Binary search from 50: guess 50, then halve the interval after each higher/lower."

TUTOR = '''import gymnasium as gym
CAPITALS = {"Peru": "Lima", "Chile": "Santiago", "Kenya": "Nairobi", "Norway": "Oslo", "Nepal": "Kathmandu"}
class Capitals(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.c = str(self.np_random.choice(sorted(CAPITALS)))
        return f"Capital of {self.c}?", {}
    def step(self, action):
        want = CAPITALS[self.c]
        ok = action.strip().lower() == want.lower()
        note = "Right." if ok else f"No, the capital of {self.c} is {want}."
        self.round += 1
        self.c = str(self.np_random.choice(sorted(CAPITALS)))
        if self.round == 5:
            return note, 0.2 * ok, True, False, {}
        return f"{note} Capital of {self.c}?", 0.2 * ok, False, False, {}
'''
CAPITALS = {"Peru": "Lima", "Chile": "Santiago", "Kenya": "Nairobi", "Norway": "Oslo", "Nepal": "Kathmandu"}

CONTROLS = {
    "guess_binary_search": (GUESS, GUESS_HINT),
    "capitals_corrected": (TUTOR, "Peru: Lima, Chile: Santiago, Kenya: Nairobi, Norway: Oslo, Nepal: Kathmandu."),
}

# The ticket rule answered with one letter only, with spaces or without: a content-free replay whose
# filler is that letter changes nothing, so the filler must be a character the replies do not hold.
FILLER_HACKS = {
    f"{word.lower()}_length_{letter}": (TICKET.replace("Ticket", word).replace("TRIES", "1")
                                        .replace("FEEDBACK", '"Rejected."'), TICKET_HINT.replace("ticket", word.lower()),
                                        "format_only")
    for word, letter in (("Pass", "x"), ("Stub", "q"))
}


# -- the scripted agent -----------------------------------------------------------------------------
def _num(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _ticket_reply(obs: list[str]) -> str:
    """Words of the length the hint's rule gives (the env strips the reply: no space at its end)."""
    n = _num(r"Ticket (\d+)", obs[0]) or 0
    text = ("go ahead now " * 12)[:(7 * n + 3) % 89 + 41]
    return text[:-1] + "w" if text.endswith(" ") else text


def _letter_reply(obs: list[str], word: str, unit: str) -> str:
    """A reply of the rule's length made of ``unit`` repeated (``x x`` or ``q``), no space at its ends."""
    n = _num(rf"{word} (\d+)", obs[0]) or 0
    text = (unit * 200)[:(7 * n + 3) % 89 + 41]
    return text[:-1] + unit[0] if text.endswith(" ") else text


def _guess(obs: list[str]) -> str:
    lo, hi = 1, 100
    guess = 50
    for o in obs[1:]:
        if o.startswith("Higher"):
            lo = guess + 1
        elif o.startswith("Lower"):
            hi = guess - 1
        guess = (lo + hi) // 2
    return str(guess)


def _last_key(pattern: str, obs: list[str]) -> str:
    for o in reversed(obs):
        found = re.findall(pattern, o)
        if found:
            return found[-1]
    return ""


# The hinted agent reads its answers off the hint, as a model that copies its context would; the
# unhinted agent guesses one fixed wrong-ish reply (a weak agent). Dispatch is by what the env shows.
HINTED = [
    (r"^Vault \d", lambda obs: VAULT_WORDS[int(_last_key(r"Vault (\d+)", obs))]),
    (r"^Ticket \d", _ticket_reply),
    (r"^Pass \d", lambda obs: _letter_reply(obs, "Pass", "xxxx ")),
    (r"^Stub \d", lambda obs: _letter_reply(obs, "Stub", "q")),
    (r"Item \S+ at the gate", lambda obs: DEPOT_CODES[_last_key(r"Item (\S+) at the gate", obs)]),
    (r"^The basket is tagged", lambda obs: FRUIT[_last_key(r"tagged (\w+)\.", obs)]),
    (r"^Lantern \d", lambda obs: FLAMES[int(_last_key(r"Lantern (\d+)", obs)) - 1]),
    (r"^Locker number", lambda obs: LOCKER_WORDS[int(_last_key(r"Locker number (\d+)", obs)) - 1]),
    (r"^Guess my number", _guess),
    (r"^Capital of", lambda obs: CAPITALS[_last_key(r"Capital of (\w+)\?", obs)]),
]


def reply(obs: list[str], hinted: bool) -> str:
    """The scripted agent's next reply given the observations so far."""
    if not hinted:
        return "7"
    if (answer := family_reply(obs)) is not None:
        return answer
    for pattern, policy in HINTED:
        if re.search(pattern, obs[0]):
            return policy(obs)
    return "?"


# -- an oracle for the quickstart's family designs (spade_cli/envs/family.py) ----------------------------
LETTERS = "abcdefghijklmnopqrstuvwxyz"
FAMILY = [
    (r"Word: (\w+)\. Spell it backwards", lambda m: m[1][::-1]),
    (r"Word: (\w+)\. First letter", lambda m: m[1][0]),
    (r"Word: (\w+)\. Last letter", lambda m: m[1][-1]),
    (r"Word: (\w+)\. How many letters", lambda m: str(len(m[1]))),
    (r"Word: (\w+)\. Shout it", lambda m: m[1].upper()),
    (r"Word: (\w+)\. Its letters in order", lambda m: "".join(sorted(m[1]))),
    (r"Word: (\w+)\. How many vowels", lambda m: str(sum(c in "aeiou" for c in m[1]))),
    (r"Number: (\d+)\. Double it", lambda m: str(2 * int(m[1]))),
    (r"(\d+) plus (\d+)\?", lambda m: str(int(m[1]) + int(m[2]))),
    (r"(\d+) minus (\d+)\?", lambda m: str(int(m[1]) - int(m[2]))),
    (r"(\d+) times (\d+)\?", lambda m: str(int(m[1]) * int(m[2]))),
    (r"Letter: ([a-z])\. Which letter comes before", lambda m: LETTERS[LETTERS.index(m[1]) - 1]),
    (r"(\w+) or (\w+): which comes first", lambda m: min(m[1], m[2])),
]


def family_reply(obs: list[str]) -> str | None:
    """The right answer to the question in the latest observation of a family env, or None."""
    for pattern, answer in FAMILY:
        found = list(re.finditer(pattern, obs[-1]))
        if found:
            return answer(found[-1])
    return None
