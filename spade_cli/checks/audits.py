"""Audits of the Designer's reward in `spade regret`: solutions that do not depend on the seed.

Hint-regret rewards an env whose hinted episodes succeed where unhinted ones fail. If the hinted
agent's winning actions also win on other seeds of the same env, the hint carried an answer
that does not depend on the task instance (a password, a fixed answer sequence): the env is
``seed_invariant``, and its regret measures copying, not learning. The audit runs on whatever
rollouts it is given (spade's own, shards, rows written by another tool), with the sandbox and no
model: for each env with a successful hinted episode, the recorded actions of its best one are
replayed on ``k`` other seeds, each in a fresh confined process; if they solve at least
``min_share`` of them, the env is flagged.

``form_only`` replays the same episode on its own seed with every reply's content replaced by
filler of the same form: if that still solves it, the reward reads only the form (``format_only``).

Cost: ``k`` + 2 replay episodes per env with a successful hinted episode (no generation). It
catches answers that are the same for every seed, whatever form they take (validate's probes catch
those that can be read off the hint). It misses answers that vary with the seed in a way the hint
still gives away (a hint that depends on the seed is not possible: the hint is one string per env),
and solutions that are general strategies (which is what a good env wants: a general strategy
replayed as fixed actions rarely solves another seed, since the observations differ).

    flags = seed_invariance({"3f2a...": (code, ["17", "4", "99"])}, pool, run_seed=0)
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import msgspec

from spade_cli.core.artifacts import open_input

AUDIT_ITERATION = -2  # replay seeds come from episode_seed in an iteration of their own
SOLVED = 0.8          # a return at least this high is a success (validate's `trivial` threshold)


class _Turn(msgspec.Struct):
    action: str = ""


class _Row(msgspec.Struct):
    env_id: str
    turns: list[_Turn] = []
    seed: int | None = None


def read_actions(locations: dict[str, tuple[Path, int]], seeds: dict[str, int] | None = None,
                 ) -> dict[str, list[str]]:
    """The actions of the episode at each ``(path, line)``, keyed by env id (one pass per file);
    ``seeds``, when given, receives each episode's env seed."""
    by_file: dict[Path, dict[int, str]] = {}
    for env_id, (path, lineno) in locations.items():
        by_file.setdefault(Path(path), {})[lineno] = env_id
    dec = msgspec.json.Decoder(_Row)
    out: dict[str, list[str]] = {}
    for path, wanted in by_file.items():
        with open_input(path) as fh:
            for lineno, raw in enumerate(fh, 1):
                env_id = wanted.get(lineno)
                if env_id is not None:
                    row = dec.decode(raw)
                    out[env_id] = [t.action for t in row.turns]
                    if seeds is not None and row.seed is not None:
                        seeds[env_id] = row.seed
                    if len(out) == len(locations):
                        break
    return out


def replay_seed(run_seed: int, env_id: str, i: int, key: str = "") -> int:
    from spade_cli.rollout.seeds import episode_seed

    return episode_seed(run_seed, AUDIT_ITERATION, env_id, i, key)


def replay(worker, name: str, seed: int, actions: list[str]) -> float:
    """Return of one episode that plays ``actions`` in order (stopping when the env ends)."""
    worker.reset(name, seed)
    total = 0.0
    try:
        for a in actions:
            _obs, r, term, trunc, _info = worker.step(name, a)
            total += r
            if term or trunc:
                break
    finally:
        worker.close_episode(name)
    return total


def seed_invariance(solutions: dict[str, tuple[str, list[str]]], pool, *, run_seed: int, k: int = 4,
                    min_share: float = 0.75, key: str = "") -> dict[str, dict]:
    """Per env: the replay's figures and whether they make it ``seed_invariant``. ``key``
    (``seeds.seed_key``) makes the replay seeds ones the env cannot tell from rollout's."""
    from spade_cli.sandbox import EnvError

    out: dict[str, dict] = {}
    for env_id, (code, actions) in sorted(solutions.items()):
        solved = 0
        tag = hashlib.sha256(env_id.encode()).hexdigest()[:8]
        try:
            w = pool.open(code, env_id)
            try:
                for i in range(k):
                    solved += replay(w, f"audit-{tag}-{i}", replay_seed(run_seed, env_id, i, key), actions) >= SOLVED
            finally:
                w.close()
            error = None
        except EnvError as err:  # an env that breaks under its own recorded actions is not flagged here
            error = err.reason
        share = solved / k
        out[env_id] = {"audit": "seed_replay", "replays": k, "solved": solved, "actions": len(actions),
                       "error": error, "seed_invariant": error is None and share >= min_share}
    return out


# Every non-space character of the replies becomes one filler, then another: the first two of
# these that the episode's replies do not hold, so that each replaced character changes. With fixed
# ones, replies made only of `x` (a length rule's answer `xxxxxxxxxxxx`) stayed as they were, and
# an episode that proves nothing was not judged, so such a reward kept its pay.
FILLERS = "xqzjkvwXQZJKVW0123456789#%&*+=@^~"


def fillers(actions: list[str], n: int = 2) -> list[str]:
    """The first ``n`` fillers absent from every reply (past the list: other printable characters)."""
    used = set("".join(actions))
    spare = (c for c in itertools.chain(FILLERS, map(chr, itertools.count(0xA1)))
             if c not in used and c.isprintable() and not c.isspace())
    return list(itertools.islice(spare, n))


def content_free(actions: list[str], fill: str) -> list[str]:
    """The replies with their content gone and their form kept: same lengths, lines and words."""
    return ["".join(c if c.isspace() else fill for c in a) for a in actions]


def form_only(solutions: dict[str, tuple[str, int, list[str]]], pool) -> dict[str, dict]:
    """Per env: does its best hinted episode, replayed on its own seed with every reply's content
    replaced by filler of the same form (``content_free``), still solve it, for both fillers? Then
    the reward reads only the reply's form (a length, a line count that the hint states as a rule
    over what the observation shows), and the env is ``format_only``. The fillers are characters
    the replies do not hold (``fillers``), so only replies without content (spaces or nothing)
    stay unchanged; they prove nothing, and such an episode is not judged."""
    from spade_cli.sandbox import EnvError

    out: dict[str, dict] = {}
    for env_id, (code, seed, actions) in sorted(solutions.items()):
        tag = hashlib.sha256(env_id.encode()).hexdigest()[:8]
        fills = [content_free(actions, f) for f in fillers(actions)]
        if any(f == actions for f in fills):
            continue
        solved, error = 0, None
        try:
            w = pool.open(code, env_id)
            try:
                for i, replies in enumerate(fills):
                    solved += replay(w, f"form-{tag}-{i}", seed, replies) >= SOLVED
            finally:
                w.close()
        except EnvError as err:
            error = err.reason
        out[env_id] = {"replays": len(fills), "solved": solved, "error": error,
                       "format_only": error is None and solved == len(fills)}
    return out
