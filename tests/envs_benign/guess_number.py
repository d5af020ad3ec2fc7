"""Number guessing with higher/lower feedback: a classic puzzle shape."""
import gymnasium as gym


class GuessNumber(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, 101))
        self.turns = 0
        return "I picked a number from 1 to 100. Guess it.", {}

    def step(self, action):
        self.turns += 1
        try:
            guess = int(action.strip().split()[-1])
        except (ValueError, IndexError):
            return "Please answer with a number.", 0.0, False, self.turns >= 12, {"turn": self.turns}
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"turn": self.turns}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong; go {hint}.", 0.0, False, self.turns >= 12, {"turn": self.turns}
