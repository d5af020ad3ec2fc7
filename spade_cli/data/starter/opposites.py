"""Opposites: give the opposite of each word; wrong answers are corrected."""
import gymnasium as gym

PAIRS = {"hot": "cold", "up": "down", "big": "small", "fast": "slow", "day": "night", "wet": "dry"}


class Opposites(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.word = str(self.np_random.choice(list(PAIRS)))
        return f"Opposite of {self.word}?", {}

    def step(self, action):
        want = PAIRS[self.word]
        ok = action.strip().lower() == want
        note = "Yes." if ok else f"No, the opposite of {self.word} is {want}."
        self.round += 1
        self.word = str(self.np_random.choice(list(PAIRS)))
        if self.round == 4:
            return note, 0.25 * ok, True, False, {}
        return f"{note} Opposite of {self.word}?", 0.25 * ok, False, False, {}
