"""Balancing chemical equations

The agent balances a sequence of four chemical equations. For each it replies with the integer
coefficients, smallest whole numbers, in the order the species appear. A correct answer earns 0.25;
each equation allows two attempts, and the checker reports which elements are unbalanced.
"""

import math
import re
import string

import gymnasium as gym
from gymnasium import spaces

REACTIONS = [
    (["H2", "O2"], ["H2O"]), (["CH4", "O2"], ["CO2", "H2O"]), (["C3H8", "O2"], ["CO2", "H2O"]),
    (["Fe", "O2"], ["Fe2O3"]), (["Al", "O2"], ["Al2O3"]), (["N2", "H2"], ["NH3"]),
    (["KClO3"], ["KCl", "O2"]), (["C2H6", "O2"], ["CO2", "H2O"]), (["Na", "H2O"], ["NaOH", "H2"]),
    (["Ca(OH)2", "HCl"], ["CaCl2", "H2O"]), (["Al", "HCl"], ["AlCl3", "H2"]), (["P4", "O2"], ["P4O10"]),
    (["C6H12O6", "O2"], ["CO2", "H2O"]), (["Fe2O3", "CO"], ["Fe", "CO2"]), (["NH3", "O2"], ["NO", "H2O"]),
    (["Cu", "HNO3"], ["Cu(NO3)2", "NO", "H2O"]), (["Mg", "N2"], ["Mg3N2"]), (["SO2", "O2"], ["SO3"]),
]


def atoms(formula):
    """Element counts of a formula with optional parenthesised groups, e.g. Ca(OH)2."""
    stack = [{}]
    for tok in re.findall(r"[A-Z][a-z]?\d*|\(|\)\d*", formula):
        if tok == "(":
            stack.append({})
        elif tok.startswith(")"):
            group = stack.pop()
            k = int(tok[1:] or 1)
            for el, c in group.items():
                stack[-1][el] = stack[-1].get(el, 0) + c * k
        else:
            el = re.match(r"[A-Z][a-z]?", tok).group(0)
            stack[-1][el] = stack[-1].get(el, 0) + int(tok[len(el):] or 1)
    return stack[0]


def imbalance(left, right, coefs):
    totals = {}
    for sign, side, cs in ((1, left, coefs[:len(left)]), (-1, right, coefs[len(left):])):
        for f, c in zip(side, cs, strict=True):
            for el, k in atoms(f).items():
                totals[el] = totals.get(el, 0) + sign * c * k
    return sorted(el for el, v in totals.items() if v)


class EquationBalancerEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        picks = self.np_random.choice(len(REACTIONS), size=4, replace=False)
        self.queue = [REACTIONS[int(i)] for i in picks]
        self.index = self.tries = 0
        return ("Balance each equation: reply with the smallest whole-number coefficients in order, e.g. "
                "'2 1 2'. Four equations, two attempts each. " + self._show(), {"index": 0})

    def _show(self):
        left, right = self.queue[self.index]
        return f"Equation {self.index + 1}: {' + '.join(left)} -> {' + '.join(right)}"

    def step(self, action):
        left, right = self.queue[self.index]
        nums = [int(x) for x in re.findall(r"\d+", str(action))][-(len(left) + len(right)):]
        reward = 0.0
        if len(nums) == len(left) + len(right) and all(0 < x < 100 for x in nums) \
                and not imbalance(left, right, nums) and math.gcd(*nums) == 1:
            reward, msg, advance = 0.25, "Balanced.", True
        else:
            self.tries += 1
            bad = imbalance(left, right, nums) if len(nums) == len(left) + len(right) else ["format"]
            msg = "Not balanced or not smallest (" + ", ".join(bad or ["common factor"]) + ")."
            advance = self.tries >= 2
        if advance:
            self.index += 1
            self.tries = 0
            if self.index == len(self.queue):
                return msg + " All equations done.", reward, True, False, {"index": self.index}
            msg += " " + self._show()
        return msg, reward, False, False, {"index": self.index}
