"""Price lookup: call a JSON tool to read prices, then submit the order total."""
import json

import gymnasium as gym

ITEMS = ["apple", "bread", "cheese", "dates"]


class PriceLookup(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.prices = {k: int(self.np_random.integers(2, 20)) for k in ITEMS}
        self.order = {k: int(self.np_random.integers(1, 4)) for k in ITEMS[:2]}
        self.turns = 0
        return ("Order: " + json.dumps(self.order) + '. Tools: {"tool": "price", "item": NAME} '
                'and {"tool": "submit", "total": N}.'), {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= 8
        try:
            call = json.loads(action.strip())
            tool = call["tool"]
        except (ValueError, KeyError, TypeError):
            return "Reply with one JSON tool call.", 0.0, False, done, {}
        if tool == "price" and call.get("item") in self.prices:
            return f"{call['item']} costs {self.prices[call['item']]}.", 0.0, False, done, {}
        if tool == "submit":
            total = sum(self.prices[k] * n for k, n in self.order.items())
            ok = call.get("total") == total
            return ("Correct total." if ok else "Wrong total."), float(ok), True, False, {}
        return "Unknown tool or item.", 0.0, False, done, {}
