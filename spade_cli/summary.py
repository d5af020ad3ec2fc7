"""The numbers behind `spade inspect`: what an artifact holds, computed in one streaming pass.

Works on any spade JSONL (designs, validations, rollouts, scores, memory, eval) and on a mix of
them; a bad row stops with its file and line like every other reader. Each schema gets the view a
researcher opens that file for:

- designs: parsed vs failed, parse errors by kind, per prompt group and per grounding document,
  completion lengths;
- validation: valid vs invalid by reason, the checks that failed most, the env step time;
- rollouts: hinted and unhinted returns (overall and per env), error codes, turns;
- scores: the regret and reward distributions, audit flags, the top environments;
- memory: history lengths and the labels the Designer's prompt uses (learnable, too easy = solved, …);
- tokens per role: the Designer's completions and the Agent's episodes (agent vs env tokens).

``summarize(paths, where)`` returns a plain dict whose keys are documented in docs/cli.md (`spade
inspect --json`); ``where`` filters rows by ``KEY=VALUE`` on the upgraded row (``reason=trivial``,
``doc.id=wiki-3``, ``hinted=true``) before anything is counted.

    spade inspect runs/demo/iter_0000/validated.jsonl --where reason=trivial --row 0
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import read_rows
from spade_cli.core.records import (
    FAILED_PREFIX,
    Design,
    Eval,
    Memory,
    Record,
    Rollout,
    Score,
    Validation,
    to_row,
)
from spade_cli.designer.curriculum import quantile

TOP = 10  # rows of a "most/top" list in the summary


def describe(values: Iterable[float | None]) -> dict | None:
    """n, mean, min, quartiles and max of a list of numbers (None when empty)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return {"n": len(vals), "mean": sum(vals) / len(vals), "min": vals[0], "p25": quantile(vals, 0.25),
            "median": quantile(vals, 0.5), "p75": quantile(vals, 0.75), "max": vals[-1]}


# -- --where ---------------------------------------------------------------------------------------

def parse_where(items: Iterable[str]) -> list[tuple[str, str]]:
    """``["reason=trivial", "doc.id=x"]`` -> ``[("reason", "trivial"), ("doc.id", "x")]``."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--where takes KEY=VALUE, got {item!r}")
        out.append((key, value))
    return out


def _lookup(row: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(row, dict) or part not in row:
            return _MISSING
        row = row[part]
    return row


_MISSING = object()


def matches(row: dict, where: list[tuple[str, str]]) -> bool:
    """Every KEY=VALUE holds: the value as text (``trivial``) or as JSON (``true``, ``null``, ``3``)."""
    for key, want in where:
        got = _lookup(row, key)
        if got is _MISSING:
            return False
        if not (isinstance(got, str) and got == want) and json.dumps(got, default=str) != want:
            return False
    return True


def select(paths: Iterable[str | Path], where: list[tuple[str, str]] = ()) -> Iterator[tuple[Path, int, Record]]:
    """The records of ``paths`` that satisfy ``where`` (all of them when it is empty)."""
    for path, line, rec in read_rows(paths):
        if not where or matches(to_row(rec), where):
            yield path, line, rec


def nth_row(paths: Iterable[str | Path], n: int, where: list[tuple[str, str]] = ()) -> tuple[Path, int, dict] | None:
    """The n-th record (0-based, across files, among those matching ``where``) as a plain dict."""
    for i, (path, line, rec) in enumerate(select(paths, where)):
        if i == n:
            return path, line, to_row(rec)
    return None


# -- one accumulator per schema ------------------------------------------------------------------

def _failed(rec: Design) -> bool:
    """A design that did not parse (its env_id names the failed sample, not an environment)."""
    return rec.code is None


def _kind(error: str) -> str:
    """The kind of a parse error: its text before any detail after a colon."""
    return error.split(":", 1)[0].strip() or "unknown"


class Designs:
    def __init__(self) -> None:
        self.rows = self.failed = 0
        self.kinds: Counter[str] = Counter()
        self.groups: dict[str, dict] = {}
        self.docs: dict[str, dict] = defaultdict(lambda: {"rows": 0, "failed": 0})
        self.tokens: list[int] = []
        self.chars: list[int] = []
        self.finish: Counter[str] = Counter()

    def add(self, rec: Design) -> None:
        failed = _failed(rec)
        self.rows += 1
        self.failed += failed
        if failed:
            self.kinds[_kind(rec.parse_error or "no code")] += 1
        doc_id = (rec.doc or {}).get("id") if isinstance(rec.doc, dict) else None
        g = self.groups.setdefault("(none)" if rec.group_id is None else str(rec.group_id), {"doc_id": doc_id, "rows": 0, "failed": 0})
        g["rows"] += 1
        g["failed"] += failed
        d = self.docs[str(doc_id) if doc_id is not None else "(none)"]
        d["rows"] += 1
        d["failed"] += failed
        if rec.tokens and rec.tokens.get("completion_ids") is not None:
            self.tokens.append(len(rec.tokens["completion_ids"]))
        if rec.completion is not None:
            self.chars.append(len(rec.completion))
        if rec.gen and rec.gen.get("finish_reason"):
            self.finish[str(rec.gen["finish_reason"])] += 1

    def result(self) -> dict:
        return {"rows": self.rows, "parsed": self.rows - self.failed, "failed": self.failed,
                "parse_errors": dict(self.kinds.most_common()), "by_group": self.groups,
                "by_doc": dict(self.docs), "completion_tokens": describe(self.tokens),
                "completion_chars": describe(self.chars), "finish_reasons": dict(self.finish.most_common())}


class Validations:
    def __init__(self) -> None:
        self.rows = self.valid = 0
        self.reasons: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.failed_checks: Counter[str] = Counter()
        self.step_ms: list[float] = []

    def add(self, rec: Validation) -> None:
        self.rows += 1
        self.valid += bool(rec.valid)
        if not rec.valid:
            self.reasons[rec.reason or "unknown"] += 1
        if _failed(rec) and rec.parse_error:
            self.kinds[_kind(rec.parse_error)] += 1
        for c in rec.checks or []:
            if isinstance(c, dict) and c.get("ok") is False:
                self.failed_checks[str(c.get("name"))] += 1
        p50 = (rec.stats or {}).get("step_ms_p50")
        if isinstance(p50, int | float):
            self.step_ms.append(float(p50))

    def result(self) -> dict:
        return {"rows": self.rows, "valid": self.valid, "invalid": self.rows - self.valid,
                "valid_rate": self.valid / self.rows if self.rows else None,
                "reasons": dict(self.reasons.most_common()), "parse_errors": dict(self.kinds.most_common()),
                "failed_checks": dict(self.failed_checks.most_common(TOP)),
                "step_ms_p50": describe(self.step_ms)}


class Rollouts:
    def __init__(self) -> None:
        self.returns: dict[bool, list[float]] = {True: [], False: []}
        self.per_env: dict[str, dict] = {}
        self.errors: Counter[str] = Counter()
        self.turns: list[int] = []
        self.ends: Counter[str] = Counter()

    def add(self, rec: Rollout) -> None:
        self.returns[bool(rec.hinted)].append(rec.return_)
        e = self.per_env.setdefault(rec.env_id, {True: [], False: [], "errors": 0})
        e[bool(rec.hinted)].append(rec.return_)
        if rec.error:
            self.errors[rec.error] += 1
            e["errors"] += 1
        self.turns.append(len(rec.turns or []))
        self.ends["error" if rec.error else "terminated" if rec.terminated else
                  "truncated" if rec.truncated else "neither"] += 1

    def result(self) -> dict:
        def mean(v: list[float]) -> float | None:
            return sum(v) / len(v) if v else None

        per_env = {}
        for env_id, e in sorted(self.per_env.items()):
            h, u = mean(e[True]), mean(e[False])
            per_env[env_id] = {"hinted_mean": h, "unhinted_mean": u, "hinted_n": len(e[True]),
                               "unhinted_n": len(e[False]), "gap": None if h is None or u is None else h - u,
                               "errors": e["errors"]}
        return {"episodes": len(self.turns), "envs": len(per_env), "hinted": describe(self.returns[True]),
                "unhinted": describe(self.returns[False]), "errors": dict(self.errors.most_common()),
                "ends": dict(self.ends.most_common()), "turns": describe(self.turns), "per_env": per_env}


class Scores:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.flags: Counter[str] = Counter()

    def add(self, rec: Score) -> None:
        flags = list(rec.extra.get("flags") or [])
        self.flags.update(flags)
        self.rows.append({"env_id": rec.env_id, "regret": rec.regret, "regret_ci95": rec.regret_ci95,
                          "hinted_mean": rec.hinted_mean, "unhinted_mean": rec.unhinted_mean,
                          "designer_reward": rec.designer_reward, "valid": rec.extra.get("valid"),
                          "flags": flags})

    def result(self) -> dict:
        ranked = sorted(self.rows, key=lambda r: (-(r["designer_reward"] or 0.0), r["env_id"]))
        return {"rows": len(self.rows), "regret": describe(r["regret"] for r in self.rows),
                "designer_reward": describe(r["designer_reward"] for r in self.rows),
                "flags": dict(self.flags.most_common()), "flagged": sum(bool(r["flags"]) for r in self.rows),
                "top": ranked[:TOP]}


class Memories:
    def __init__(self) -> None:
        self.history: list[int] = []
        self.labels: Counter[str] = Counter()
        self.flags: Counter[str] = Counter()

    def add(self, rec: Memory) -> None:
        from spade_cli.designer.prompts import label  # the labels the Designer's prompt shows

        self.history.append(len(rec.history))
        last = rec.history[-1] if rec.history else {}
        self.labels[label(last.get("unhinted_mean"), last.get("hinted_mean"), last.get("regret"))] += 1
        self.flags.update(rec.extra.get("flags") or [])

    def result(self) -> dict:
        return {"envs": len(self.history), "history_len": describe(self.history),
                "learnable": self.labels["learnable"], "solved": self.labels["too easy"],
                "labels": dict(self.labels.most_common()), "flags": dict(self.flags.most_common())}


# -- the whole file --------------------------------------------------------------------------------

def _count_tokens(tokens: dict, role: dict) -> None:
    completion = tokens.get("completion_ids") or []
    role["prompt"] += len(tokens.get("prompt_ids") or [])
    role["completion"] += len(completion)
    mask = tokens.get("env_mask")
    if "agent" in role:  # an episode: agent tokens are env_mask 1, env observations 0
        generated = sum(mask) if mask else len(completion)
        role["agent"] += generated
        role["env"] += len(completion) - generated


def summarize(paths: Iterable[str | Path], where: list[tuple[str, str]] = ()) -> dict:
    """The summary of every row in ``paths`` that matches ``where`` (keys: see docs/cli.md)."""
    schemas: Counter[str] = Counter()
    parts: dict[str, Any] = {}
    kinds = ((Validation, "validation", Validations), (Design, "designs", Designs),
             (Rollout, "rollouts", Rollouts), (Score, "scores", Scores), (Memory, "memory", Memories))
    tokens = {"designer": {"prompt": 0, "completion": 0},
              "agent": {"prompt": 0, "completion": 0, "agent": 0, "env": 0}}
    envs: set[str] = set()
    evals: list[dict] = []
    files: list[str] = []
    for path, _, rec in select(paths, where):
        if not files or files[-1] != str(path):
            files.append(str(path))
        schemas[rec.schema] += 1
        if isinstance(rec, Eval):
            evals.append({"task": rec.task, "metric": rec.metric, "value": rec.value,
                          "stderr": rec.stderr, "n": rec.n})
            continue
        _, key, acc = next(k for k in kinds if isinstance(rec, k[0]))
        parts.setdefault(key, acc()).add(rec)
        # a design that failed to parse is no environment; neither is the score row it gets
        if not (isinstance(rec, Design) and _failed(rec)) and not rec.env_id.startswith(FAILED_PREFIX):
            envs.add(rec.env_id)
        if isinstance(rec, Design | Rollout) and rec.tokens:
            _count_tokens(rec.tokens, tokens["agent" if isinstance(rec, Rollout) else "designer"])
    out: dict[str, Any] = {"files": files, "rows": sum(schemas.values()), "schemas": dict(schemas),
                           "envs": len(envs)}
    if where:
        out["where"] = dict(where)
    for _, key, _ in kinds:
        if key in parts:
            out[key] = parts[key].result()
    if evals:
        out["eval"] = evals
    out["tokens"] = {role: t for role, t in tokens.items() if any(t.values())}
    return out
