"""Escape from the locked observatory

A small text adventure. Four rooms, a handful of objects, a locked safe and a locked exit door.
The agent reads descriptions, moves between rooms, examines and takes objects, opens the safe with
a code found in the house, and unlocks the exit with the key from the safe. Progress earns partial
credit: 0.2 for opening the safe, 0.3 for taking the key, 0.5 for escaping.
"""

import re
import string

import gymnasium as gym
from gymnasium import spaces

ROOMS = {
    "hall": {"north": "library", "east": "study"},
    "library": {"south": "hall", "east": "dome"},
    "study": {"west": "hall", "north": "dome"},
    "dome": {"west": "library", "south": "study"},
}
HELP = "Commands: go DIRECTION, look, examine THING, take THING, open safe CODE, unlock door, inventory."


class EscapeRoomEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=40):
        self.observation_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.code = "".join(str(int(d)) for d in rng.integers(0, 10, size=4))
        self.safe_room = ["study", "dome", "library"][int(rng.integers(3))]
        self.clue_room = [r for r in ["library", "dome", "study"] if r != self.safe_room][int(rng.integers(2))]
        self.clue_thing = ["globe", "painting", "telescope"][int(rng.integers(3))]
        self.room = "hall"
        self.safe_open = self.has_key = False
        self.steps = 0
        return "You wake up in the hall of a locked observatory; the exit door is locked. " + HELP + " " + \
            self._look(), {"room": self.room}

    def _look(self):
        things = []
        if self.room == self.safe_room:
            things.append("a steel safe with a 4-digit lock" + (" (open)" if self.safe_open else ""))
        if self.room == self.clue_room:
            things.append(f"an old {self.clue_thing}")
        if self.room == "hall":
            things.append("the exit door")
        exits = ", ".join(sorted(ROOMS[self.room]))
        return f"You are in the {self.room}. You see: {'; '.join(things) or 'nothing special'}. Exits: {exits}."

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action).lower()
        info = {"room": self.room}
        reward = 0.0
        if m := re.search(r"\bgo\s+(north|south|east|west)\b", text):
            nxt = ROOMS[self.room].get(m.group(1))
            msg = "You cannot go that way."
            if nxt:
                self.room = nxt
                msg = self._look()
        elif m := re.search(r"\bopen\s+(?:the\s+)?safe\s+(?:with\s+)?(\d{4})\b", text):
            if self.room != self.safe_room:
                msg = "There is no safe here."
            elif self.safe_open:
                msg = "The safe is already open."
            elif m.group(1) == self.code:
                self.safe_open = True
                reward = 0.2
                msg = "Click. The safe opens; inside lies a brass key."
            else:
                msg = "The lock buzzes: wrong code."
        elif re.search(r"\btake\b.*\bkey\b", text):
            if self.room == self.safe_room and self.safe_open and not self.has_key:
                self.has_key = True
                reward = 0.3
                msg = "You take the brass key."
            else:
                msg = "There is no key you can take here."
        elif re.search(r"\bunlock\b.*\bdoor\b", text):
            if self.room == "hall" and self.has_key:
                return "The door swings open. You escaped!", 0.5, True, False, info
            msg = "You cannot unlock the door now."
        elif m := re.search(r"\bexamine\s+(?:the\s+)?(\w+)", text):
            if self.room == self.clue_room and m.group(1) == self.clue_thing:
                msg = f"Scratched into the {self.clue_thing}: the digits {self.code[::-1]}, written mirror-wise."
            elif m.group(1) == "safe" and self.room == self.safe_room:
                msg = "A 4-digit combination lock. Someone wrote 'read me backwards' on its side."
            else:
                msg = "Nothing unusual."
        elif re.search(r"\blook\b", text):
            msg = self._look()
        elif re.search(r"\binventory\b", text):
            msg = "You carry: " + ("a brass key." if self.has_key else "nothing.")
        else:
            msg = "Nothing happens. " + HELP
        info["room"] = self.room
        return msg, reward, False, truncated, info
