"""Seeds and ids of episodes, derived from content so reruns, shards and arms agree.

An episode's env seed follows from the run seed, the iteration, the env id, the pair and a key
drawn from the stage's whole input (``seed_key``), so no env can compute the seeds it will be
judged on; its id and each reply's sampling seed follow from the same parts, never from the batch
it happens to share. ``episode_specs`` lays out the k hinted and k unhinted episodes per env, and
``budget_pairs`` splits an iteration's fixed budget of seed pairs over its valid envs. Validate,
rollout and regret's audits all read their seeds here (docs/architecture.md, 'Records').
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from spade_cli.rollout.episode_state import EpisodeSpec


def _digest(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def seed_material(row: Any) -> str:
    """What one input row (a design or validation record) adds to the seeds' key: its env id and,
    where a model wrote it, what the sampler drew (its tokens and their log-probabilities)."""
    tokens = getattr(row, "tokens", None)
    if not tokens:
        return row.env_id
    return row.env_id + ":" + _digest(json.dumps(tokens, sort_keys=True))


def seed_key(materials: Iterable[str]) -> str:
    """The key of a stage's env seeds, from ``seed_material`` of every row of its input.

    Without it every seed would follow from ``--seed``, the iteration and the env id, and an env
    can compute its own id (a source that knows its own text and hint): it could then tell
    validation's seeds from rollout's and behave only where it is judged. Other rows are other
    samples of the Designer, and the sampler's draws are known to no env; a file of one
    hand-written design holds no such secret. Row contents, not the files' bytes: a validation
    row holds timings, and the same designs must give the same seeds, so that reruns, resumed
    runs, shards and the arms of a comparison on one envs file agree.
    """
    return _digest("key", *sorted(set(materials)))[:32]


def episode_seed(run_seed: int, iteration: int, env_id: str, pair: int, key: str = "") -> int:
    """The env seed of one pair: the hinted and the unhinted episode of the pair share it."""
    parts = ("seed", run_seed, iteration, env_id, pair, key) if key else ("seed", run_seed, iteration, env_id, pair)
    return int(_digest(*parts)[:8], 16) & 0x7FFFFFFF


def episode_id(run_seed: int, iteration: int, env_id: str, pair: int, hinted: bool) -> str:
    return _digest("episode", run_seed, iteration, env_id, pair, int(hinted))[:20]


def budget_pairs(env_ids: list[str], budget: int) -> dict[str, int]:
    """Seed pairs per env when an iteration has a fixed budget of ``budget`` pairs: the budget split
    evenly over the valid envs, the remainder one pair each to the first envs in input order. An
    iteration with fewer valid envs than designed plays more seeds of each, one with more (replay,
    a pool) fewer, so every arm's Agent plays the same number of episodes (docs/report.md)."""
    if not env_ids:
        return {}
    base, extra = divmod(budget, len(env_ids))
    return {e: base + (i < extra) for i, e in enumerate(env_ids)}


def episode_specs(env_ids: list[str], k: int | dict[str, int], run_seed: int, iteration: int, key: str = "",
                  ) -> list[EpisodeSpec]:
    """k unhinted and k hinted episodes per env (``k`` a number, or per env from ``budget_pairs``),
    on the same k seeds, grouped by env. Which
    episode of a pair starts first is drawn per pair (from the seeds, so reruns agree): an env
    that could count its starts would learn nothing from the order."""
    out = []
    for e in env_ids:
        for p in range(k.get(e, 0) if isinstance(k, dict) else k):
            first = int(_digest("order", run_seed, iteration, e, p)[:2], 16) & 1
            for h in ((False, True) if first == 0 else (True, False)):
                out.append(EpisodeSpec(episode_id(run_seed, iteration, e, p, h), e, iteration, h,
                                       episode_seed(run_seed, iteration, e, p, key), p))
    return out


def turn_seed(episode_id: str, turn: int) -> int:
    """The sampling seed of one reply: by episode and turn, never by the batch it happens to share,
    so an episode replayed after a crash (kill -9, a lost worker) gets the very same replies, in
    either batching mode."""
    return int(_digest("gen", episode_id, turn)[:8], 16) & 0x7FFFFFFF
