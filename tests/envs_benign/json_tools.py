"""Multi-step JSON tool use: look up two facts with tool calls, then submit their sum."""
import json

import gymnasium as gym

TOOLS = ["get_price", "get_quantity", "submit"]


class InventoryTools(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.item = ["apples", "pears", "plums"][int(rng.integers(0, 3))]
        self.price = int(rng.integers(2, 20))
        self.qty = int(rng.integers(1, 9))
        self.seen = set()
        self.t = 0
        prompt = {"task": f"What is the total value of our {self.item}?", "tools": TOOLS,
                  "format": '{"tool": NAME, "arguments": {...}}'}
        return json.dumps(prompt), {"tools": TOOLS}

    def step(self, action):
        self.t += 1
        truncated = self.t >= 10
        try:
            call = json.loads(action)
            name, args = call["tool"], call.get("arguments", {})
        except (ValueError, TypeError, KeyError, AttributeError):
            return json.dumps({"error": "expected a JSON tool call"}), 0.0, False, truncated, {}
        if name == "get_price":
            self.seen.add("price")
            return json.dumps({"price": self.price}), 0.0, False, truncated, {}
        if name == "get_quantity":
            self.seen.add("qty")
            return json.dumps({"quantity": self.qty}), 0.0, False, truncated, {}
        if name == "submit":
            ok = isinstance(args, dict) and args.get("value") == self.price * self.qty
            bonus = 0.2 if self.seen == {"price", "qty"} else 0.0
            reward = (0.8 + bonus) if ok else 0.0
            return json.dumps({"correct": ok}), reward, True, False, {"correct": ok}
        return json.dumps({"error": f"unknown tool {name!r}"}), 0.0, False, truncated, {}
