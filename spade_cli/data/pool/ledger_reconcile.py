"""Ledger reconciliation against a bank statement

The agent is a bookkeeper with a JSON tool API over a simulated bank account. The company ledger
has drifted from the bank statement: some statement lines were never booked and some ledger
entries were booked twice. The agent must make the ledger match the statement exactly and submit.
"""

import json
import string

import gymnasium as gym
from gymnasium import spaces

PAYEES = ["Acme Paper", "City Water", "Northwind", "Globex", "Initech", "Umbrella Ins.", "Stark Rent",
          "Wayne Fuel", "Hooli Cloud", "Vandelay Imports", "Soylent Foods", "Tyrell Parts"]
HELP = ('Tools (send one JSON object per turn): {"tool": "statement"}, {"tool": "ledger"}, '
        '{"tool": "book", "ref": REF} copies a statement line into the ledger, '
        '{"tool": "delete", "entry": ENTRY_ID} removes a ledger entry, {"tool": "submit"} ends the task.')


class LedgerReconcileEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=30):
        self.observation_space = spaces.Text(max_length=20000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        n = int(rng.integers(6, 10))
        self.statement = []
        for i in range(n):
            self.statement.append({"ref": f"S{100 + i}", "day": int(rng.integers(1, 29)),
                                   "payee": PAYEES[int(rng.integers(len(PAYEES)))],
                                   "amount": round(float(rng.integers(500, 90000)) / 100, 2)})
        missing = {int(i) for i in rng.choice(n, size=2, replace=False)}
        doubled = int(rng.choice([i for i in range(n) if i not in missing]))
        self.ledger = []
        for i, line in enumerate(self.statement):
            if i in missing:
                continue
            copies = 2 if i == doubled else 1
            for _ in range(copies):
                self.ledger.append({"entry": f"L{len(self.ledger) + 1:02d}", "ref": line["ref"],
                                    "day": line["day"], "payee": line["payee"], "amount": line["amount"]})
        self.steps = 0
        self.next_entry = len(self.ledger) + 1
        return ("Reconcile the company ledger with the bank statement for March, then submit. " + HELP,
                {"lines": n})

    def _balanced(self):
        booked = sorted(e["ref"] for e in self.ledger)
        return booked == sorted(s["ref"] for s in self.statement)

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action)
        try:
            call = json.loads(text[text.index("{"):text.rindex("}") + 1])
            tool = call.get("tool") if isinstance(call, dict) else None
        except (ValueError, TypeError):
            call, tool = {}, None
        if tool == "statement":
            return json.dumps(self.statement), 0.0, False, truncated, {"tool": tool}
        if tool == "ledger":
            return json.dumps(self.ledger), 0.0, False, truncated, {"tool": tool}
        if tool == "book":
            line = next((s for s in self.statement if s["ref"] == str(call.get("ref"))), None)
            if line is None:
                return "error: unknown statement ref", 0.0, False, truncated, {"tool": tool}
            entry = {"entry": f"L{self.next_entry:02d}", **line}
            self.next_entry += 1
            self.ledger.append(entry)
            return f"booked as {entry['entry']}", 0.0, False, truncated, {"tool": tool}
        if tool == "delete":
            before = len(self.ledger)
            self.ledger = [e for e in self.ledger if e["entry"] != str(call.get("entry"))]
            ok = len(self.ledger) < before
            return ("deleted" if ok else "error: no such entry"), 0.0, False, truncated, {"tool": tool}
        if tool == "submit":
            if self._balanced():
                return "Submitted: the ledger matches the statement.", 1.0, True, False, {"tool": tool}
            return "Submitted: the ledger does not match the statement.", 0.0, True, False, {"tool": tool}
        return "error: expected a JSON tool call. " + HELP, 0.0, False, truncated, {"tool": None}
