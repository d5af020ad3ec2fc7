"""Exact sum: add numbers from 1 to 9 to reach the target total exactly."""
import gymnasium as gym


class ExactSum(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(20, 41))
        self.total = 0
        self.turns = 0
        return f"Reach exactly {self.target}. Each turn add a number from 1 to 9. Total: 0.", {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= 8
        try:
            n = int(action.strip().split()[-1])
        except (ValueError, IndexError):
            return f"Reply with a number from 1 to 9. Total: {self.total}.", 0.0, False, done, {}
        if not 1 <= n <= 9:
            return f"Only 1 to 9. Total: {self.total}.", 0.0, False, done, {}
        self.total += n
        if self.total == self.target:
            return "Exactly right!", 1.0, True, False, {}
        if self.total > self.target:
            return f"Total {self.total} is past {self.target}.", 0.0, True, False, {}
        return f"Total: {self.total}.", 0.0, False, done, {}
