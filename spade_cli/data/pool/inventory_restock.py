"""Warehouse restocking under a purchasing budget

A JSON tool API over a simulated warehouse. Each SKU has a stock level and a target level, and
two suppliers quote different unit prices. The agent must bring every SKU up to its target
without exceeding the purchasing budget, then close the purchase order.
"""

import json
import string

import gymnasium as gym
from gymnasium import spaces

ITEMS = ["bolts", "nuts", "washers", "hinges", "brackets", "rivets", "springs", "gaskets", "valves",
         "fuses", "pulleys", "clamps"]
HELP = ('Tools (one JSON object per turn): {"tool": "stock"} lists SKUs with stock and target, '
        '{"tool": "quote", "sku": SKU} shows both suppliers\' unit prices, '
        '{"tool": "order", "sku": SKU, "supplier": "north"|"south", "qty": INT}, '
        '{"tool": "close"} ends the task. Orders are charged immediately.')


class InventoryRestockEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=40):
        self.observation_space = spaces.Text(max_length=20000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        names = [ITEMS[int(i)] for i in rng.choice(len(ITEMS), size=5, replace=False)]
        self.skus = {}
        need = 0
        for name in sorted(names):
            stock = int(rng.integers(0, 20))
            target = stock + int(rng.integers(5, 30))
            prices = {"north": int(rng.integers(2, 12)), "south": int(rng.integers(2, 12))}
            self.skus[name] = {"stock": stock, "target": target, "prices": prices}
            need += (target - stock) * min(prices.values())
        # the budget covers the cheapest plan plus a little slack, not a careless one
        self.budget = need + int(rng.integers(0, 6))
        self.spent = 0
        self.steps = 0
        return (f"Restock the warehouse: every SKU must reach its target level. Budget: {self.budget} "
                f"credits. " + HELP, {"budget": self.budget})

    def _status(self):
        return {k: {"stock": v["stock"], "target": v["target"]} for k, v in self.skus.items()}

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action)
        try:
            call = json.loads(text[text.index("{"):text.rindex("}") + 1])
            tool = call.get("tool") if isinstance(call, dict) else None
        except (ValueError, TypeError):
            call, tool = {}, None
        info = {"tool": tool if isinstance(tool, str) else None, "spent": self.spent}
        if tool == "stock":
            return json.dumps(self._status()), 0.0, False, truncated, info
        if tool == "quote":
            sku = self.skus.get(str(call.get("sku")))
            if sku is None:
                return "error: unknown sku", 0.0, False, truncated, info
            return json.dumps(sku["prices"]), 0.0, False, truncated, info
        if tool == "order":
            sku = self.skus.get(str(call.get("sku")))
            supplier = call.get("supplier")
            qty = call.get("qty")
            if sku is None or supplier not in ("north", "south") or not isinstance(qty, int) or qty < 1:
                return "error: order needs a known sku, a supplier and a positive integer qty", 0.0, False, \
                    truncated, info
            cost = sku["prices"][supplier] * qty
            if self.spent + cost > self.budget:
                return f"error: order of {cost} credits exceeds the remaining budget", 0.0, False, truncated, info
            self.spent += cost
            sku["stock"] += qty
            info["spent"] = self.spent
            return (f"ordered {qty} for {cost} credits; remaining budget {self.budget - self.spent}", 0.0,
                    False, truncated, info)
        if tool == "close":
            met = sum(v["stock"] >= v["target"] for v in self.skus.values())
            reward = 1.0 if met == len(self.skus) else 0.0
            return f"Purchase order closed: {met}/{len(self.skus)} SKUs at target.", reward, True, False, info
        return "error: expected a JSON tool call. " + HELP, 0.0, False, truncated, info
