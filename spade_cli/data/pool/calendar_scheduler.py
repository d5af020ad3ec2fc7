"""Team meeting scheduler over a shared calendar API

A JSON tool API over simulated calendars. The agent must book several meetings, each with a set of
attendees, into one-hour slots of a five-day week (hours 9 to 16) so that nobody is double-booked
and no meeting overlaps an attendee's existing appointments.
"""

import json
import string

import gymnasium as gym
from gymnasium import spaces

PEOPLE = ["ana", "ben", "chen", "dara", "eli", "fay", "gus"]
DAYS = ["mon", "tue", "wed", "thu", "fri"]
HOURS = list(range(9, 17))
HELP = ('Tools (one JSON object per turn): {"tool": "meetings"}, {"tool": "busy", "person": NAME} '
        'lists that person\'s busy [day, hour] slots, {"tool": "book", "meeting": ID, "day": DAY, '
        '"hour": H}, {"tool": "done"} ends the task. Days: mon..fri, hours 9..16.')


class CalendarSchedulerEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps=30):
        self.observation_space = spaces.Text(max_length=20000, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4000, min_length=0, charset=string.printable)
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        slots = [(d, h) for d in DAYS for h in HOURS]
        self.busy = {}
        for p in PEOPLE:
            picks = rng.choice(len(slots), size=int(rng.integers(22, 30)), replace=False)
            self.busy[p] = sorted(slots[int(i)] for i in picks)
        self.meetings = {}
        for m in range(4):
            size = int(rng.integers(2, 4))
            who = sorted(PEOPLE[int(i)] for i in rng.choice(len(PEOPLE), size=size, replace=False))
            self.meetings[f"M{m + 1}"] = who
        # keep one common free slot per meeting so that every instance is solvable
        for m, who in self.meetings.items():
            d, h = slots[(int(m[1:]) * 7 + int(rng.integers(0, 5))) % len(slots)]
            for p in who:
                self.busy[p] = [s for s in self.busy[p] if s != (d, h)]
        self.booked = {}
        self.steps = 0
        return "Book every meeting into a slot where all its attendees are free. " + HELP, {"meetings": 4}

    def _taken(self, person):
        return set(self.busy[person]) | {(d, h) for m, (d, h) in self.booked.items()
                                         if person in self.meetings[m]}

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.max_steps
        text = str(action)
        try:
            call = json.loads(text[text.index("{"):text.rindex("}") + 1])
            tool = call.get("tool") if isinstance(call, dict) else None
        except (ValueError, TypeError):
            call, tool = {}, None
        info = {"booked": len(self.booked)}
        if tool == "meetings":
            return json.dumps(self.meetings), 0.0, False, truncated, info
        if tool == "busy":
            person = call.get("person")
            if person not in self.busy:
                return "error: unknown person", 0.0, False, truncated, info
            return json.dumps([list(s) for s in self.busy[person]]), 0.0, False, truncated, info
        if tool == "book":
            m, d, h = call.get("meeting"), call.get("day"), call.get("hour")
            if m not in self.meetings or d not in DAYS or h not in HOURS:
                return "error: book needs a meeting id, a day mon..fri and an hour 9..16", 0.0, False, \
                    truncated, info
            if m in self.booked:
                return f"error: {m} is already booked", 0.0, False, truncated, info
            clash = [p for p in self.meetings[m] if (d, h) in self._taken(p)]
            if clash:
                return f"error: {', '.join(clash)} not free then", 0.0, False, truncated, info
            self.booked[m] = (d, h)
            info["booked"] = len(self.booked)
            return f"{m} booked {d} {h}:00", 0.0, False, truncated, info
        if tool == "done":
            reward = len(self.booked) / len(self.meetings)
            return f"{len(self.booked)} of {len(self.meetings)} meetings booked.", reward, True, False, info
        return "error: expected a JSON tool call. " + HELP, 0.0, False, truncated, info
