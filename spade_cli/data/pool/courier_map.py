"""Parcel courier on a road network with a fuel limit

The agent drives a van between towns. It only sees the roads leaving its current town, must
deliver three parcels to their destination towns and return to the depot, and has a fuel budget
that leaves little room for detours. Each delivered parcel earns 0.25 and the return to the depot
with every parcel delivered earns the final 0.25.
"""

import heapq
import re
import string

import gymnasium as gym
from gymnasium import spaces

TOWNS = ["Ashby", "Brill", "Corfe", "Dunmow", "Eyam", "Frome", "Goole", "Hythe", "Ilkley", "Jarrow"]


class CourierMapEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=40):
        self.observation_space = spaces.Text(max_length=8000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def _dist(self, a):
        best = {a: 0}
        heap = [(0, a)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > best[u]:
                continue
            for v, w in sorted(self.roads[u].items()):
                if d + w < best.get(v, 10**9):
                    best[v] = d + w
                    heapq.heappush(heap, (d + w, v))
        return best

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        n = len(TOWNS)
        self.roads = {t: {} for t in TOWNS}
        for i in range(n):  # a ring keeps the map connected, chords add shortcuts
            a, b = TOWNS[i], TOWNS[(i + 1) % n]
            w = int(rng.integers(3, 10))
            self.roads[a][b] = self.roads[b][a] = w
        for _ in range(5):
            i, j = (int(x) for x in rng.choice(n, size=2, replace=False))
            a, b = TOWNS[i], TOWNS[j]
            w = int(rng.integers(2, 12))
            self.roads[a][b] = self.roads[b][a] = min(w, self.roads[a].get(b, 99))
        self.depot = TOWNS[0]
        self.todo = sorted(TOWNS[int(i)] for i in rng.choice(range(1, n), size=3, replace=False))
        # fuel: the tour in the best visiting order along shortest paths, plus 20 percent
        d = {t: self._dist(t) for t in [self.depot, *self.todo]}
        orders = [[a, b, c] for a in self.todo for b in self.todo for c in self.todo if len({a, b, c}) == 3]
        best = min(d[self.depot][o[0]] + d[o[0]][o[1]] + d[o[1]][o[2]] + d[o[2]][self.depot] for o in orders)
        self.fuel = int(best * 1.2) + 1
        self.at = self.depot
        self.delivered = []
        self.steps = 0
        return (f"You are at the depot in {self.depot} with parcels for {', '.join(self.todo)}. Fuel: "
                f"{self.fuel}. Commands: 'drive TOWN' along a road, 'deliver' at a destination. Deliver all "
                f"and return to {self.depot}. " + self._where(), {"fuel": self.fuel})

    def _where(self):
        roads = ", ".join(f"{t} ({w})" for t, w in sorted(self.roads[self.at].items()))
        return f"At {self.at}. Roads: {roads}. Fuel left {self.fuel}."

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action)
        reward = 0.0
        m = re.search(r"drive\s+(?:to\s+)?([A-Za-z]+)", text, re.I)
        if re.fullmatch(r"\s*map\s*\.?\s*", text, re.I):
            roads = sorted(f"{a}-{b} ({w})" for a in TOWNS for b, w in self.roads[a].items() if a < b)
            msg = "Road map: " + ", ".join(roads) + "."
        elif re.search(r"\bdeliver\b", text, re.I) and not m:
            if self.at in self.todo and self.at not in self.delivered:
                self.delivered.append(self.at)
                reward = 0.25
                msg = f"Parcel delivered in {self.at}."
            else:
                msg = "No parcel for this town."
        elif m:
            town = m.group(1).capitalize()
            w = self.roads[self.at].get(town)
            if w is None:
                msg = f"No road from {self.at} to {town}."
            elif w > self.fuel:
                msg = "Not enough fuel for that road."
            else:
                self.fuel -= w
                self.at = town
                msg = f"Drove to {town}."
        else:
            msg = "Unknown command; use 'drive TOWN' or 'deliver'."
        if self.at == self.depot and len(self.delivered) == len(self.todo):
            return msg + " Back at the depot with every parcel delivered.", reward + 0.25, True, False, \
                {"delivered": len(self.delivered)}
        stuck = min(self.roads[self.at].values()) > self.fuel
        return msg + " " + self._where(), reward, stuck, truncated and not stuck, {"delivered": len(self.delivered)}
