"""Decoding a relay of shifted-alphabet radio messages

Three intercepted radio messages arrive one after another, each encrypted with its own Caesar
shift. The agent may ask for letter frequencies or try a shift before answering; for each message
it must reply with the decoded text. Each correct decoding earns one third, and each message
allows six actions.
"""

import re
import string

import gymnasium as gym
from gymnasium import spaces

WORDS = ["convoy", "harbour", "station", "signal", "bridge", "supply", "eastern", "northern", "depot",
         "arrives", "leaves", "at", "dawn", "noon", "midnight", "the", "from", "to", "via", "fuel", "train",
         "river", "crossing", "tunnel", "second", "third", "sector", "east", "west", "gate", "seven", "nine"]


def shift(text, k):
    out = []
    for ch in text:
        if ch.isalpha():
            out.append(chr((ord(ch) - 97 + k) % 26 + 97))
        else:
            out.append(ch)
    return "".join(out)


class CaesarRelayEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, actions_per_message=6):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.budget = actions_per_message

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.plain = [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=7)) for _ in range(3)]
        self.keys = [int(k) for k in rng.integers(1, 26, size=3)]
        self.index = 0
        self.used = 0
        return ("Decode each message (lowercase words). Actions: 'FREQ' shows letter counts of the current "
                "message, 'TRY k' shows it shifted back by k, 'ANSWER <text>' submits. " + self._show(),
                {"message": 0})

    def _show(self):
        return f"Message {self.index + 1}/3: {shift(self.plain[self.index], self.keys[self.index])}"

    def step(self, action):
        text = str(action).strip()
        cipher = shift(self.plain[self.index], self.keys[self.index])
        self.used += 1
        reward = 0.0
        advance = False
        if m := re.match(r"(?is)answer\s*:?\s*(.*)", text):
            guess = " ".join(re.findall(r"[a-z]+", m.group(1).lower()))
            if guess == self.plain[self.index]:
                reward, msg, advance = 1.0 / 3.0, "Correct.", True
            else:
                msg = "Incorrect."
        elif m := re.match(r"(?i)try\s+(-?\d+)", text):
            msg = f"Shifted back by {int(m.group(1)) % 26}: {shift(cipher, -int(m.group(1)))}"
        elif re.match(r"(?i)freq", text):
            counts = {}
            for ch in cipher:
                if ch.isalpha():
                    counts[ch] = counts.get(ch, 0) + 1
            msg = "Counts: " + ", ".join(f"{c}={n}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        else:
            msg = "Unknown action; use FREQ, TRY k or ANSWER <text>."
        if not advance and self.used >= self.budget:
            advance = True
            msg += " Out of actions for this message."
        if advance:
            self.index += 1
            self.used = 0
            if self.index == 3:
                return msg + " Relay finished.", reward, True, False, {"message": self.index}
            msg += " " + self._show()
        return msg, reward, False, False, {"message": self.index}
