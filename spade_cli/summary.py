"""The numbers behind `spade inspect`: what an artifact holds, computed in one streaming pass.

Works on any spade JSONL (designs, validations, rollouts, scores, memory, eval) and on a mix of
them; a bad row stops with its file and line like every other reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from spade_cli.artifacts import read_rows
from spade_cli.records import Design, Eval, Memory, Rollout, Score, Validation


def describe(values: list[float]) -> dict | None:
    """n, mean, min, quartiles and max of a list of numbers (None when empty)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None

    def q(p: float) -> float:
        k = (len(vals) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
        return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)

    return {"n": len(vals), "mean": sum(vals) / len(vals), "min": vals[0], "p25": q(0.25),
            "median": q(0.5), "p75": q(0.75), "max": vals[-1]}


def summarize(paths: Iterable[str | Path]) -> dict:
    schemas: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    parse_errors = valid = 0
    returns: dict[str, list[float]] = {"hinted": [], "unhinted": []}
    regrets: list[float] = []
    rewards: list[float] = []
    tokens = {"prompt": 0, "completion": 0, "agent": 0}
    envs: set[str] = set()
    evals: list[dict] = []
    for _, _, rec in read_rows(paths):
        schemas[rec.schema] += 1
        if isinstance(rec, Design):
            envs.add(rec.env_id)
            if rec.parse_error:
                parse_errors += 1
            if isinstance(rec, Validation):
                valid += rec.valid
                if not rec.valid:
                    reasons[rec.reason or "unknown"] += 1
        if isinstance(rec, Design | Rollout) and rec.tokens:
            tokens["prompt"] += len(rec.tokens.get("prompt_ids") or [])
            tokens["completion"] += len(rec.tokens.get("completion_ids") or [])
            mask = rec.tokens.get("env_mask")
            tokens["agent"] += sum(mask) if mask else len(rec.tokens.get("completion_ids") or [])
        if isinstance(rec, Rollout):
            envs.add(rec.env_id)
            returns["hinted" if rec.hinted else "unhinted"].append(rec.return_)
            if rec.error:
                errors[rec.error] += 1
        elif isinstance(rec, Score):
            envs.add(rec.env_id)
            if rec.regret is not None:
                regrets.append(rec.regret)
            rewards.append(rec.designer_reward)
        elif isinstance(rec, Memory):
            envs.add(rec.env_id)
            regrets.extend(h["regret"] for h in rec.history if h.get("regret") is not None)
        elif isinstance(rec, Eval):
            evals.append({"task": rec.task, "metric": rec.metric, "value": rec.value, "n": rec.n})
    out: dict = {"rows": sum(schemas.values()), "schemas": dict(schemas), "envs": len(envs)}
    n_val = schemas.get("spade.validation/1", 0)
    if n_val:
        out["valid"] = valid
        out["valid_rate"] = valid / n_val
        out["invalid_reasons"] = dict(reasons.most_common())
    if parse_errors:
        out["parse_errors"] = parse_errors
    if returns["hinted"] or returns["unhinted"]:
        out["returns"] = {k: describe(v) for k, v in returns.items()}
        out["episode_errors"] = dict(errors.most_common())
    if regrets:
        out["regret"] = describe(regrets)
    if rewards:
        out["designer_reward"] = describe(rewards)
    if any(tokens.values()):
        out["tokens"] = tokens
    if evals:
        out["eval"] = evals
    return out


def nth_row(paths: Iterable[str | Path], n: int) -> tuple[Path, int, dict] | None:
    """The n-th record (0-based, across files), upgraded and as a plain dict."""
    from spade_cli.records import to_row

    for i, (path, line, rec) in enumerate(read_rows(paths)):
        if i == n:
            return path, line, to_row(rec)
    return None
