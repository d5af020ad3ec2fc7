"""Guess the number: higher/lower feedback until the agent names it."""
import gymnasium as gym


class GuessNumber(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, 101))
        self.turns = 0
        return "I picked a whole number from 1 to 100. Guess it; reply with a number.", {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= 10
        try:
            guess = int(action.strip().split()[-1])
        except (ValueError, IndexError):
            return "Reply with a number.", 0.0, False, done, {}
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        side = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong; go {side}.", 0.0, False, done, {}
