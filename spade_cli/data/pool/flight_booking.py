"""Travel desk: booking the cheapest valid itinerary

A JSON tool API over a simulated flight inventory. A traveller needs to get from an origin to a
destination, arriving by a deadline, within a budget. Direct flights exist but are expensive or
late; connections through other airports must leave at least 45 minutes to change planes. The
cheapest valid itinerary earns 1, a valid but more expensive one 0.4.
"""

import json
import string

import gymnasium as gym
from gymnasium import spaces

AIRPORTS = ["AMS", "BCN", "CPH", "DUB", "EDI", "FRA", "GVA", "HEL", "IST", "LIS"]
HELP = ('Tools (one JSON object per turn): {"tool": "search", "from": CODE, "to": CODE} lists flights, '
        '{"tool": "book", "flights": [ID, ...]} books an itinerary (ends the task).')


class FlightBookingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=25):
        self.observation_space = spaces.Text(max_length=20000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        order = [AIRPORTS[int(i)] for i in rng.permutation(len(AIRPORTS))]
        self.origin, self.dest, hubs = order[0], order[1], order[2:6]
        self.deadline = 18 * 60
        self.flights = {}

        def add(a, b, dep, dur, price):
            fid = f"F{len(self.flights) + 100}"
            self.flights[fid] = {"id": fid, "from": a, "to": b, "dep": dep, "arr": dep + dur, "price": price}

        add(self.origin, self.dest, 7 * 60 + 30, 150, int(rng.integers(420, 520)))  # valid but pricey
        add(self.origin, self.dest, 16 * 60 + 40, 150, int(rng.integers(150, 220)))  # cheap but late
        # one comfortable connection, so a connection always beats both direct flights
        add(self.origin, hubs[0], 8 * 60, 90, int(rng.integers(100, 180)))
        add(hubs[0], self.dest, 10 * 60 + 30, 100, int(rng.integers(100, 180)))
        for hub in hubs:
            for _ in range(2):
                dep1 = int(rng.integers(6 * 60, 12 * 60) // 5 * 5)
                arr1 = dep1 + int(rng.integers(60, 150))
                add(self.origin, hub, dep1, arr1 - dep1, int(rng.integers(60, 200)))
                gap = int(rng.choice([20, 30, 50, 70, 110]))
                add(hub, self.dest, arr1 + gap, int(rng.integers(60, 150)), int(rng.integers(60, 200)))
        self.best = min(p for p, _ in self._valid_itineraries())
        self.steps = 0
        return (f"Book a trip from {self.origin} to {self.dest} arriving by 18:00, as cheaply as possible "
                f"(at most one connection, >= 45 min to connect). " + HELP, {"origin": self.origin})

    def _valid_itineraries(self):
        fl = sorted(self.flights.values(), key=lambda f: f["id"])
        out = [(f["price"], [f["id"]]) for f in fl
               if f["from"] == self.origin and f["to"] == self.dest and f["arr"] <= self.deadline]
        for a in fl:
            for b in fl:
                if a["from"] == self.origin and a["to"] == b["from"] and b["to"] == self.dest \
                        and b["dep"] - a["arr"] >= 45 and b["arr"] <= self.deadline:
                    out.append((a["price"] + b["price"], [a["id"], b["id"]]))
        return out

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action)
        try:
            call = json.loads(text[text.index("{"):text.rindex("}") + 1])
            tool = call.get("tool") if isinstance(call, dict) else None
        except (ValueError, TypeError):
            call, tool = {}, None
        if tool == "search":
            hits = [dict(f, dep=f"{f['dep'] // 60:02d}:{f['dep'] % 60:02d}",
                         arr=f"{f['arr'] // 60:02d}:{f['arr'] % 60:02d}")
                    for f in sorted(self.flights.values(), key=lambda f: f["dep"])
                    if f["from"] == call.get("from") and f["to"] == call.get("to")]
            return json.dumps(hits), 0.0, False, truncated, {"tool": "search"}
        if tool == "book":
            ids = call.get("flights")
            ids = [str(i) for i in ids] if isinstance(ids, list) else []
            match = [p for p, its in self._valid_itineraries() if its == ids]
            if not match:
                return "Booking rejected: not a valid itinerary.", 0.0, True, False, {"tool": "book"}
            reward = 1.0 if match[0] == self.best else 0.4
            return f"Booked for {match[0]}.", reward, True, False, {"tool": "book", "price": match[0]}
        return "error: expected a JSON tool call. " + HELP, 0.0, False, truncated, {"tool": None}
