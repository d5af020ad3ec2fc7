"""Relay: repeat each code word the radio sends, four rounds."""
import gymnasium as gym

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano"]


class Relay(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return f"Radio: {self.word}. Relay it.", {}

    def step(self, action):
        ok = action.strip().lower() == self.word
        self.round += 1
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        if self.round == 4:
            return "Over.", 0.25 * ok, True, False, {}
        note = "Relayed." if ok else "Garbled."
        return f"{note} Radio: {self.word}. Relay it.", 0.25 * ok, False, False, {}
