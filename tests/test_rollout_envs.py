"""Environment sources and an in-process stand-in sandbox shared by the rollout tests.

The stand-in has the public API of ``spade_cli.sandbox`` (``open`` / ``reset`` / ``step`` /
``close_episode`` / ``close`` / ``alive``) but runs env code in the test's own interpreter: it
narrows unit tests to the engine's orchestration. Integration tests use the real sandbox.
"""

from __future__ import annotations

import json

GUESS = '''
import gymnasium as gym

class Guess(gym.Env):
    """Guess a digit; the observation says higher/lower."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(0, 10))
        self.t = 0
        return f"Guess a digit from 0 to 9. (episode seed tag {self.target * 7 % 10})", {}

    def step(self, action):
        self.t += 1
        digits = [c for c in action if c.isdigit()]
        if digits and int(digits[0]) == self.target:
            return "correct", 1.0, True, False, {}
        hint = "higher" if digits and int(digits[0]) < self.target else "lower"
        return f"wrong, try {hint} (turn {self.t})", 0.0, False, self.t >= 6, {}
'''

# Crashes its process at the second step of every episode. CRASH is the way to die: os._exit in
# the real sandbox; the stand-in below maps SystemExit to a dead worker.
CRASHER = '''
import gymnasium as gym

class Crasher(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "say anything", {}

    def step(self, action):
        self.t += 1
        if self.t == 2:
            CRASH
        return f"turn {self.t} ok", 0.0, False, False, {}
'''

RAISER = '''
import gymnasium as gym

class Raiser(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {}

    def step(self, action):
        raise RuntimeError("broken step")
'''

HINT = "The target digit is what the tag says times 3 modulo 10."


def validation_row(code: str, hint: str = HINT, valid: bool = True, **extra: object) -> dict:
    return {"schema": "spade.validation/1", "code": code, "hint": hint, "valid": valid,
            "reason": None if valid else "syntax_error", **extra}


def write_envs(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class StandInError(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class StandInWorker:
    def __init__(self, code: str, pool: StandInPool):
        import gymnasium as gym

        ns: dict = {}
        exec(compile(code.replace("CRASH", "raise SystemExit(3)"), "<env>", "exec"), ns)
        self.cls = next(v for v in ns.values() if isinstance(v, type) and issubclass(v, gym.Env) and v is not gym.Env)
        self.envs: dict = {}
        self.alive = True
        self.pool = pool

    def _call(self, fn, stage: str):
        if not self.alive:
            raise StandInError("crashed", "worker is dead")
        try:
            return fn()
        except SystemExit:
            self.alive = False
            raise StandInError("crashed", "process exited") from None
        except Exception as exc:
            raise StandInError(f"{stage}_exception", str(exc)) from None

    def reset(self, episode_id: str, seed: int):
        self.pool.resets.append((episode_id, seed))
        env = self.envs[episode_id] = self.cls()
        return self._call(lambda: env.reset(seed=seed), "reset")

    def step(self, episode_id: str, action: str):
        self.pool.steps.append((episode_id, action))
        return self._call(lambda: self.envs[episode_id].step(action), "step")

    def close_episode(self, episode_id: str) -> None:
        self.envs.pop(episode_id, None)

    def close(self) -> None:
        self.alive = False


class StandInPool:
    tier = "stand-in"

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.resets: list = []
        self.steps: list = []

    def open(self, code: str, env_id: str) -> StandInWorker:
        self.opened.append(env_id)
        return StandInWorker(code, self)

    def close(self) -> None:
        pass
