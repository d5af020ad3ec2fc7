"""How far behind the trained checkpoint the samples of an update were drawn (docs/pipeline.md).

The sequential loop trains checkpoint i on samples that checkpoint i drew: on-policy, 0 behind.
The pipelined loop (``PIPELINE=1`` in ``recipes/loop.sh``) generates iteration i+1 with checkpoint
i while update(i) trains checkpoint i+1, so update(i+1) trains checkpoint i+1 on samples of
checkpoint i: one update behind, which the sampler correction (TIS against the stored sampler
log-probs) corrects like any other sampler mismatch.

Which checkpoint sampled: for episodes the ``model`` in each rollout file's manifest, for designs
the ``gen.model`` of each design row with tokens. How far behind: the number of updates between
that checkpoint and ``--model``, found by walking back from ``--model`` through each checkpoint's
``update.json`` (``config.model`` is the checkpoint it was trained from). A sampler that is not an
ancestor within ``LIMIT`` steps, or a file without a manifest, is "unknown" (``behind`` null).

The result goes into ``update.json`` and the update's manifest under ``staleness``;
``--max-staleness N`` refuses an update whose samples are more than N behind, or unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import SpadeError, expand_inputs, manifest_path, read_rows

LIMIT = 64


def _key(model: str) -> str:
    return str(Path(model).resolve()) if Path(model).is_dir() else model


def behind(sampler: str, trained_from: str) -> int | None:
    """Updates between ``sampler`` and ``trained_from`` along the update.json lineage, or None."""
    target, cur = _key(sampler), trained_from
    for n in range(LIMIT + 1):
        if _key(cur) == target:
            return n
        info = Path(cur) / "update.json"
        try:
            cur = json.loads(info.read_text())["config"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def _rollout_samplers(paths: list[str]) -> dict[str, list[str]]:
    """sampler model -> the rollout files it wrote ("?" when a file has no readable manifest)."""
    out: dict[str, list[str]] = {}
    for p in expand_inputs(paths):
        try:
            model = json.loads(manifest_path(p).read_text())["config"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            model = "?"
        out.setdefault(str(model), []).append(str(p))
    return out


def _design_samplers(paths: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path, _line, rec in read_rows(paths, ("spade.validation", "spade.design")):
        if not getattr(rec, "tokens", None):
            continue  # pool rows and parse failures without tokens train nothing
        model = (getattr(rec, "gen", None) or {}).get("model") or "?"
        files = out.setdefault(str(model), [])
        if str(path) not in files:
            files.append(str(path))
    return out


def _role(samplers: dict[str, list[str]], trained_from: str) -> dict[str, Any]:
    by = {m: (None if m == "?" else behind(m, trained_from)) for m in samplers}
    known = [b for b in by.values() if b is not None]
    return {"sampled_by": [{"model": m, "behind": b, "files": samplers[m]} for m, b in sorted(by.items())],
            "behind": None if len(known) < len(by) or not known else max(known)}


def measure(model: str, rollouts: list[str], designs: list[str]) -> dict[str, Any]:
    """Per role: which checkpoints sampled the rows and how many updates each is behind ``model``;
    ``behind`` overall is the largest (null when any is unknown)."""
    roles = {}
    if rollouts:
        roles["agent"] = _role(_rollout_samplers(rollouts), model)
    if designs:
        d = _design_samplers(designs)
        if d:
            roles["designer"] = _role(d, model)
    values = [r["behind"] for r in roles.values()]
    overall = None if not values or any(v is None for v in values) else max(values)
    return {"trained_from": model, "behind": overall, **roles}


def check(report: dict[str, Any], bound: int | None) -> None:
    """Refuse samples more than ``bound`` updates behind (or of an unknown sampler)."""
    if bound is None:
        return
    for role in ("agent", "designer"):
        for s in (report.get(role) or {}).get("sampled_by", []):
            if s["behind"] is None or s["behind"] > bound:
                how = "an unknown number of" if s["behind"] is None else str(s["behind"])
                raise SpadeError(f"{s['files'][0]}: the {role} samples were drawn by {s['model']}, {how} updates "
                                 f"behind {report['trained_from']} (--max-staleness {bound}); regenerate them "
                                 "or raise the bound")
