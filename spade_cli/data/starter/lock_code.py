"""Lock code: find a 3-digit code; each try says how many digits are in place."""
import gymnasium as gym


class LockCode(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.code = "".join(str(int(d)) for d in self.np_random.integers(0, 10, size=3))
        self.turns = 0
        return "Find the 3-digit code. Reply with three digits, e.g. 123.", {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= 16
        guess = action.strip()[-3:]
        if len(guess) != 3 or not guess.isdigit():
            return "Reply with exactly three digits.", 0.0, False, done, {}
        if guess == self.code:
            return "Unlocked!", 1.0, True, False, {}
        right = sum(a == b for a, b in zip(guess, self.code, strict=True))
        return f"{guess}: {right} digit(s) in place.", 0.0, False, done, {}
