"""A behavioural fingerprint of an environment: the second key of validate's ``duplicate`` check.

``astnorm.ast_hash`` sees the program's text; a copy rewritten in another structure (a helper
inlined, a ``for`` made a ``while``, ``1 + x`` for ``x + 1``) gets a new hash though it plays
the same game. The fingerprint looks at what the env does instead: one episode under validate's
scripted policy, on a seed drawn from the input's seed key but not from the env's id (so copies
are played on the same seed, and no env can compute it), and the sha256 of its transcript with
the text normalised: every observation lowercased, runs of digits as ``#``, whitespace collapsed;
the return rounded to 6 places, the step count and whether it ended.

validate (``stages/validate.py``) plays it for every design still valid after its checks and
stores it as ``stats.behaviour``; ``mark_duplicate`` then rejects, in input order, a Designer's row
whose fingerprint an earlier valid row of the same input has (the first one wins). Pool rows are
exempt, as in the AST check: a pool deals copies on purpose.

What it does not catch: a copy whose messages are reworded (the text is part of the transcript:
without it, different envs that pay 0 to the scripted replies would collide); a copy in another
iteration (memory envs are not played again, and the seed differs between inputs); an env that
behaves alike on this one episode but differs elsewhere is a duplicate by this key, which is why
the transcript keeps the text. Two envs that differ only in how they pay a right reply (per
round or at the end) look alike when the scripted replies are never right, and the second is
a duplicate (docs/results.md counts this on the quickstart's family envs).

    fp = fingerprint(obs=["Guess 1-100"], ret=0.0, steps=16, done=False)  # "beh1:..."
"""

from __future__ import annotations

import hashlib
import json
import re

VERSION = "beh1"
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")
CHECK = "duplicate_behaviour"


def normalise(text: object) -> str:
    return _SPACE.sub(" ", _DIGITS.sub("#", str(text).lower())).strip()


def fingerprint(obs: list, ret: float, steps: int, done: bool) -> str:
    """``beh1:`` + 16 hex digits of sha256 of the normalised transcript of one episode."""
    body = json.dumps([[normalise(o) for o in obs], round(float(ret), 6), steps, bool(done)])
    return f"{VERSION}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def play_fingerprint(pool, code: str, env_id: str, play, policy, seed: int, max_steps: int) -> str | None:
    """Play the fingerprint episode in a fresh process (validate's ``play``); None when the env fails
    under it (the contract checks judged the env; this is only a key)."""
    from spade_cli.sandbox import EnvError

    worker = None
    try:
        worker = pool.open(code, env_id, hash_seed=0)
        ep = play(worker, "behaviour", seed, policy, max_steps)
        return fingerprint(ep["obs"], ep["return"], ep["steps"], ep["done"])
    except EnvError:
        return None
    finally:
        if worker is not None:
            worker.close()


def seen_in(rows: list[dict]) -> dict[str, tuple[int, str]]:
    """fingerprint -> (input row, env_id) of the valid rows already written (a resumed run's)."""
    seen: dict[str, tuple[int, str]] = {}
    for i, r in enumerate(rows):
        fp = (r.get("stats") or {}).get("behaviour")
        if r.get("valid") and fp and (r.get("gen") or {}).get("backend") != "pool":
            seen.setdefault(fp, (i, r["env_id"]))
    return seen


def mark_duplicate(row: dict, index: int, seen: dict[str, tuple[int, str]]) -> dict:
    """``row`` (validate's output row ``index``) as a ``duplicate`` when an earlier valid row of the
    input played the same transcript; records a valid row's fingerprint in ``seen``."""
    fp = (row.get("stats") or {}).get("behaviour")
    if not row.get("valid") or not fp or (row.get("gen") or {}).get("backend") == "pool":
        return row
    if fp not in seen:
        seen[fp] = (index, row["env_id"])
        return row
    first, env = seen[fp]
    detail = f"same transcript under the scripted policy as env {env} (input row {first + 1})"
    check = {"name": CHECK, "ok": False, "detail": detail, "ms": 0.0}
    return {**row, "valid": False, "reason": "duplicate", "checks": [*row.get("checks", []), check],
            "stats": {**row["stats"], "duplicate_of": env}}
