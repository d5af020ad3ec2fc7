"""Signals: answer each light with the right move; wrong answers are corrected."""
import gymnasium as gym

RULES = {"red": "stop", "yellow": "wait", "green": "go"}


class Signals(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.light = str(self.np_random.choice(list(RULES)))
        return f"Light: {self.light}. Your move?", {}

    def step(self, action):
        ok = action.strip().lower() == RULES[self.light]
        note = "Right." if ok else f"Wrong: {self.light} means {RULES[self.light]}."
        self.round += 1
        self.light = str(self.np_random.choice(list(RULES)))
        if self.round == 4:
            return note, 0.25 * ok, True, False, {}
        return f"{note} Light: {self.light}. Your move?", 0.25 * ok, False, False, {}
