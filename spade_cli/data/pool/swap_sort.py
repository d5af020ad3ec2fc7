"""Sorting a shelf of numbered boxes with few swaps

A shelf holds numbered boxes in scrambled order. Each turn the agent swaps two positions. The shelf
must end in ascending order using at most the minimum number of swaps plus one; the minimum is
not told. Sorted in time earns 1; otherwise the return is 0.
"""

import re
import string

import gymnasium as gym
from gymnasium import spaces


def min_swaps(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    seen = [False] * len(values)
    cycles = 0
    for i in range(len(values)):
        if not seen[i]:
            cycles += 1
            j = i
            while not seen[j]:
                seen[j] = True
                j = order[j]
    return len(values) - cycles


class SwapSortEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        n = int(rng.integers(7, 11))
        while True:
            self.shelf = [int(v) for v in rng.choice(90, size=n, replace=False) + 10]
            need = min_swaps(self.shelf)
            if need >= n // 2:
                break
        self.budget = need + 1
        self.swaps = 0
        return (f"Sort the shelf ascending from position 1 (left) to {n} (right). Reply 'SWAP i j' to swap "
                f"two positions. Your swap allowance is tight. Shelf: {self.shelf}", {"n": n})

    def step(self, action):
        m = re.search(r"swap\s+(\d+)\s*(?:,|and)?\s*(\d+)", str(action), re.I)
        n = len(self.shelf)
        if m and 1 <= int(m.group(1)) <= n and 1 <= int(m.group(2)) <= n:
            i, j = int(m.group(1)) - 1, int(m.group(2)) - 1
            self.shelf[i], self.shelf[j] = self.shelf[j], self.shelf[i]
            self.swaps += 1
            msg = f"Swapped {i + 1} and {j + 1}. Shelf: {self.shelf}"
        else:
            self.swaps += 1  # a malformed action uses up an allowance too
            msg = f"Invalid; use 'SWAP i j' with positions 1..{n}. Shelf: {self.shelf}"
        if self.shelf == sorted(self.shelf):
            return msg + " Sorted!", 1.0, True, False, {"swaps": self.swaps}
        if self.swaps >= self.budget:
            return msg + " Out of swaps.", 0.0, True, False, {"swaps": self.swaps}
        return msg, 0.0, False, False, {"swaps": self.swaps}

