"""Next letter: name the letter that follows the one shown, four rounds."""
import gymnasium as gym

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class NextLetter(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round = 0
        self.i = int(self.np_random.integers(25))
        return f"Letter: {LETTERS[self.i]}. Next?", {}

    def step(self, action):
        want = LETTERS[self.i + 1]
        ok = action.strip().lower() == want
        note = "Yes." if ok else f"No, {want} comes after {LETTERS[self.i]}."
        self.round += 1
        self.i = int(self.np_random.integers(25))
        if self.round == 4:
            return note, 0.25 * ok, True, False, {}
        return f"{note} Letter: {LETTERS[self.i]}. Next?", 0.25 * ok, False, False, {}
