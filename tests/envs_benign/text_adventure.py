"""A small text adventure: find the key, open the door; partial credit along the way."""
import gymnasium as gym
import numpy as np

ROOMS = {"hall": ["kitchen", "study"], "kitchen": ["hall"], "study": ["hall", "vault"], "vault": ["study"]}


class Adventure(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.room = "hall"
        self.key_room = ["kitchen", "study"][int(self.np_random.integers(0, 2))]
        self.has_key = False
        self.t = 0
        return self._describe(), {}

    def _describe(self):
        exits = ", ".join(ROOMS[self.room])
        return f"You are in the {self.room}. Exits: {exits}. Commands: go ROOM, search, open vault."

    def step(self, action):
        self.t += 1
        words = action.lower().split()
        reward, done = 0.0, False
        if words[:1] == ["go"] and len(words) > 1 and words[1] in ROOMS[self.room]:
            if words[1] == "vault" and not self.has_key:
                msg = "The vault is locked."
            else:
                self.room = words[1]
                msg = self._describe()
        elif words == ["search"]:
            if self.room == self.key_room and not self.has_key:
                self.has_key, reward = True, 0.3
                msg = "You found a brass key!"
            else:
                msg = "Nothing here."
        elif words[:2] == ["open", "vault"] and self.room == "study" and self.has_key:
            reward, done = 0.7, True
            msg = "The vault opens. You win."
        else:
            msg = "Nothing happens. " + self._describe()
        return msg, float(np.float64(reward)), done, self.t >= 30, {"room": self.room}
