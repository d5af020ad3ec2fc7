"""Arithmetic drill with declared text spaces: gymnasium's check_env runs on it."""
import string

import gymnasium as gym
from gymnasium import spaces


class ArithmeticChain(gym.Env):
    def __init__(self):
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.problems = [(int(a), int(b)) for a, b in self.np_random.integers(1, 50, size=(3, 2))]
        self.i = 0
        return self._ask(), {}

    def _ask(self):
        a, b = self.problems[self.i]
        return f"Problem {self.i + 1} of 3: what is {a} + {b}?"

    def step(self, action):
        a, b = self.problems[self.i]
        right = action.strip() == str(a + b)
        self.i += 1
        done = self.i == 3
        obs = ("Right. " if right else "Wrong. ") + ("Done." if done else self._ask())
        return obs, (1.0 / 3.0) if right else 0.0, done, False, {"index": self.i}
