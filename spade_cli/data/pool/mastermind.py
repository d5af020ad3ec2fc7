"""Mastermind code breaking

The agent must find a hidden code of four letters from A-F (repeats allowed) in at most ten
guesses. After each guess it learns how many letters are right and in the right place (exact) and
how many more are right but misplaced (near).
"""

import re
import string

import gymnasium as gym
from gymnasium import spaces

LETTERS = "ABCDEF"


def score(code, guess):
    exact = sum(a == b for a, b in zip(code, guess, strict=True))
    common = sum(min(code.count(c), guess.count(c)) for c in LETTERS)
    return exact, common - exact


class MastermindEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_guesses=10):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_guesses = max_guesses

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.code = "".join(LETTERS[int(i)] for i in self.np_random.integers(0, 6, size=4))
        self.guesses = 0
        self.done = False
        return ("Guess the hidden code: 4 letters from A-F, repeats allowed, 10 guesses. Reply with a "
                "guess like 'GUESS ABCD'. Feedback: exact = right letter in the right place, near = right "
                "letter in the wrong place.", {"guesses_left": self.max_guesses})

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {"guesses_left": 0}
        m = re.search(r"GUESS\s+([A-F]{4})\b", str(action).upper())
        if not m:
            self.guesses += 1
            left = self.max_guesses - self.guesses
            self.done = left <= 0
            return (f"Invalid guess (use 'GUESS ABCD' with letters A-F); {left} guesses left.", 0.0, False,
                    self.done, {"guesses_left": left})
        guess = m.group(1)
        self.guesses += 1
        left = self.max_guesses - self.guesses
        exact, near = score(self.code, guess)
        if exact == 4:
            self.done = True
            return f"{guess}: exact 4. Cracked!", 1.0, True, False, {"guesses_left": left}
        self.done = left <= 0
        return f"{guess}: exact {exact}, near {near}; {left} guesses left.", 0.0, False, self.done, \
            {"guesses_left": left}
