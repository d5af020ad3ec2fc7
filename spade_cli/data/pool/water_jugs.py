"""Measuring water with three jugs

Three jugs of different capacities start empty next to a tap. The agent must end up with exactly
the target amount in any one jug, using fill, empty and pour moves, within a move budget.
"""

import math
import re
import string

import gymnasium as gym
from gymnasium import spaces


class WaterJugsEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_moves=20):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_moves = max_moves

    def _solvable(self, caps, target):
        # breadth-first search over jug states; the instance is kept only if a short plan exists
        start = (0, 0, 0)
        seen = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for s in frontier:
                if target in s:
                    return seen[s]
                for t in self._moves(s, caps):
                    if t not in seen:
                        seen[t] = seen[s] + 1
                        nxt.append(t)
            frontier = nxt
        return None

    def _moves(self, s, caps):
        out = []
        for i in range(3):
            out.append(tuple(caps[i] if k == i else s[k] for k in range(3)))
            out.append(tuple(0 if k == i else s[k] for k in range(3)))
            for j in range(3):
                if i != j:
                    amount = min(s[i], caps[j] - s[j])
                    out.append(tuple(s[k] - amount if k == i else s[k] + amount if k == j else s[k]
                                     for k in range(3)))
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        while True:
            caps = sorted(int(c) for c in rng.choice(range(3, 14), size=3, replace=False))
            target = int(rng.integers(1, caps[2]))
            if target in caps or math.gcd(math.gcd(*caps), target) != math.gcd(*caps):
                continue
            depth = self._solvable(caps, target)
            if depth is not None and 4 <= depth <= 10:
                break
        self.caps, self.target = caps, target
        self.jugs = [0, 0, 0]
        self.moves = 0
        return (f"Jugs A, B, C hold {caps[0]}, {caps[1]}, {caps[2]} litres and are empty. Get exactly "
                f"{target} litres into one jug. Moves: 'fill X', 'empty X', 'pour X Y' (until X is empty or "
                f"Y is full). {self.max_moves} moves.", {"target": target})

    def step(self, action):
        self.moves += 1
        text = str(action).lower()
        names = "abc"
        m = re.search(r"\b(fill|empty)\s+([abc])\b|\bpour\s+([abc])\s+(?:into\s+|to\s+)?([abc])\b", text)
        msg = "Unknown move; use 'fill X', 'empty X' or 'pour X Y'."
        if m and m.group(1):
            i = names.index(m.group(2))
            self.jugs[i] = self.caps[i] if m.group(1) == "fill" else 0
            msg = f"{m.group(1)} {m.group(2).upper()}."
        elif m and m.group(3) != m.group(4):
            i, j = names.index(m.group(3)), names.index(m.group(4))
            amount = min(self.jugs[i], self.caps[j] - self.jugs[j])
            self.jugs[i] -= amount
            self.jugs[j] += amount
            msg = f"poured {amount} from {m.group(3).upper()} into {m.group(4).upper()}."
        state = f" Jugs now A={self.jugs[0]}, B={self.jugs[1]}, C={self.jugs[2]}."
        if self.target in self.jugs:
            return msg + state + " Target reached!", 1.0, True, False, {"moves": self.moves}
        truncated = self.moves >= self.max_moves
        return msg + state, 0.0, False, truncated, {"moves": self.moves}
