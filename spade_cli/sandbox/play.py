"""One episode of a policy against a sandboxed env: what validate's checks and probes play.

validate (``stages/validate.py``) plays its contract, determinism and probe episodes through it,
and its hack checks (``stages/validate_hacks.py``) and the behavioural fingerprint
(``spade_cli/checks/behaviour.py``) replay policies the same way; it lives here, below all of them, so
that none of them imports another to reach it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable


def play(worker, episode: str, seed: int, policy: Callable[[int], str], max_steps: int, keep: bool = False) -> dict:
    """One episode; returns its observations, rewards and a digest of everything the env said.
    ``keep``: leave its process open (for ``worker.check_env(after=episode)``)."""
    obs, info = worker.reset(episode, seed)
    observations, rewards, trace = [obs], [], [obs, info]
    terminated = truncated = False
    times = []
    for t in range(max_steps):
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = worker.step(episode, policy(t))
        times.append(time.perf_counter() - t0)
        observations.append(obs)
        rewards.append(reward)
        trace += [obs, reward, terminated, truncated, info]
        if terminated or truncated:
            break
    if not keep:
        worker.close_episode(episode)
    digest = hashlib.sha256(json.dumps(trace, sort_keys=True, default=str).encode()).hexdigest()
    return {"obs": observations, "return": sum(rewards), "steps": len(rewards), "done": terminated or truncated,
            "digest": digest, "times": times}
