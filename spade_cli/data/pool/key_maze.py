"""Dark maze with a key and a locked door

The agent walks a 7x7 maze in the dark: it only learns which of the four neighbouring cells are
walls. It must pick up a key and then reach a locked door. Picking up the key earns 0.3 and
leaving through the door earns 0.7, within a step budget.
"""

import re
import string

import gymnasium as gym
from gymnasium import spaces

MOVES = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
N = 7


class KeyMazeEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=80):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def _carve(self):
        # randomized depth-first carving on the odd cells gives a perfect maze (one path between cells)
        rng = self.np_random
        self.open = {(1, 1)}
        stack = [(1, 1)]
        while stack:
            r, c = stack[-1]
            nbrs = [(r + 2 * dr, c + 2 * dc) for dr, dc in MOVES.values()
                    if 0 < r + 2 * dr < N and 0 < c + 2 * dc < N and (r + 2 * dr, c + 2 * dc) not in self.open]
            if not nbrs:
                stack.pop()
                continue
            nr, nc = nbrs[int(rng.integers(len(nbrs)))]
            self.open |= {((r + nr) // 2, (c + nc) // 2), (nr, nc)}
            stack.append((nr, nc))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._carve()
        self.pos = (1, 1)
        self.key = (N - 2, N - 2)  # the far corner from the start
        self.door = (1, N - 2) if int(self.np_random.integers(2)) else (N - 2, 1)
        self.has_key = False
        self.steps = 0
        return ("You are in a dark maze. Find the key, then the door. Moves: north, south, east, west "
                "(one per turn). " + self._sense(), {"steps": 0})

    def _sense(self):
        free = [d for d, (dr, dc) in MOVES.items() if (self.pos[0] + dr, self.pos[1] + dc) in self.open]
        extra = ""
        if self.pos == self.door:
            extra = " A locked door is here." if not self.has_key else ""
        return f"Open directions: {', '.join(free)}.{extra}"

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        words = re.findall(r"north|south|east|west", str(action).lower())
        reward = 0.0
        if not words:
            return "Say one direction: north, south, east or west. " + self._sense(), 0.0, False, truncated, \
                {"steps": self.steps}
        dr, dc = MOVES[words[0]]
        nxt = (self.pos[0] + dr, self.pos[1] + dc)
        if nxt not in self.open:
            msg = "You bump into a wall."
        else:
            self.pos = nxt
            msg = f"You walk {words[0]}."
        if self.pos == self.key and not self.has_key:
            self.has_key = True
            reward = 0.3
            msg += " You found the key!"
        if self.pos == self.door and self.has_key:
            return msg + " The key turns; you are out!", reward + 0.7, True, False, {"steps": self.steps}
        return msg + " " + self._sense(), reward, False, truncated, {"steps": self.steps}
