"""The figures of a run, one row per iteration, and their plots: what `spade report` writes and
`spade compare` compares across arms.

Input: a run directory (``spade_cli.core.layout.RunLayout``). For each iteration ``iteration_row``
reads what exists and leaves the rest empty, so a run that is still going (or died) reports what it has:

- ``designs.jsonl``: designs and parse failures.
- ``validated.jsonl``: valid count and rate, invalid reasons.
- ``rollouts*.jsonl`` (one file or Slurm shards), streamed row by row: episodes, the tokens the
  Agent generated in them (the 1s of ``env_mask``), mean hinted and unhinted return, episode errors.
- ``scores.jsonl`` and its manifest: mean regret and designer reward over the scored envs; Vendi
  score and Vendi/n from the manifest summary (``vendi``, ``vendi_per_n``, else
  ``diversity.{vendi,vendi_per_n}``).
- ``ckpt/iter_{i+1}/update.json``, the update that followed iteration i: loss, KL, entropy, clip
  ratios, grad norm, per-role advantage and reward stats, the sampler correction's statistics
  (``update.sampler.*``) and how many updates behind the trained checkpoint its samples were drawn
  (``update.staleness.*``: 0 in the sequential loop, 1 in the pipelined one; any numeric leaf, read
  defensively).
- ``eval/iter_{i}.jsonl``: the evaluation of the checkpoint iteration i played with; one column
  ``eval:<task>/<metric>`` per row. An eval of the final checkpoint gets a row of its own.
- The curriculum diagnostics (``spade_cli.reporting.curriculum``): the share of valid designs too easy,
  learnable, too hard or without signal, regret quantiles and the share whose interval lies above
  0, and for structured-spec designs the chosen difficulty levels against the Agent's frontier.

Only finished artifacts count: a stage's ``.partial-*`` file is ignored until its manifest is
written. Per-iteration figures are cached in ``report/.cache/`` keyed by the size and mtime of
the files they came from, so reporting a 400-iteration run again reads only what changed.

``write_plots`` draws the PNG plots (returns, validity, diversity, update, eval, labels, regret,
frontier), each only when it has data; ``save_figure`` writes a PNG atomically.

    rows = [iteration_row(layout, i, layout.report_dir / ".cache") for i in iterations(layout)]
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import atomic_write_text, manifest_path, read_rows
from spade_cli.core.layout import RunLayout
from spade_cli.core.records import Design, Eval, Rollout, Score, Validation
from spade_cli.designer.curriculum import level_of
from spade_cli.reporting import curriculum as report_curriculum

CACHE_VERSION = 6


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _designs(path: Path) -> dict:
    n = parse_errors = 0
    for _, _, rec in read_rows(path, expect="spade.design"):
        assert isinstance(rec, Design)
        n += 1
        parse_errors += bool(rec.parse_error)
    return {"designs": n, "parse_errors": parse_errors}


def _validated(path: Path) -> dict:
    n = valid = 0
    reasons: Counter[str] = Counter()
    levels = []
    for _, _, rec in read_rows(path, expect="spade.validation"):
        assert isinstance(rec, Validation)
        n += 1
        valid += rec.valid
        if not rec.valid:
            reasons[rec.reason or "unknown"] += 1
        elif (level := level_of(rec)) is not None:
            levels.append(level)
    return {"validated": n, "valid": valid, "valid_rate": valid / n if n else None,
            "invalid_reasons": dict(reasons.most_common()), **report_curriculum.chosen_levels(levels)}


def _agent_tokens(tokens: dict | None) -> int | None:
    """Tokens the Agent generated in one episode: the 1s of ``env_mask`` (env tokens are 0)."""
    mask = (tokens or {}).get("env_mask")
    if isinstance(mask, list):
        return sum(1 for m in mask if m)
    ids = (tokens or {}).get("completion_ids")
    return len(ids) if isinstance(ids, list) else None


def _rollouts(paths: list[Path]) -> dict:
    sums = {True: [0.0, 0], False: [0.0, 0]}
    unhinted: dict[str, list] = {}  # per env [sum, n]: the frontier's unhinted mean per level
    errors: Counter[str] = Counter()
    agent_tokens, counted = 0, 0
    for _, _, rec in read_rows(paths, expect="spade.rollout"):  # streamed: one row in memory
        assert isinstance(rec, Rollout)
        sums[rec.hinted][0] += rec.return_
        sums[rec.hinted][1] += 1
        if not rec.hinted:
            acc = unhinted.setdefault(rec.env_id, [0.0, 0])
            acc[0] += rec.return_
            acc[1] += 1
        if rec.error:
            errors[rec.error] += 1
        n_tokens = _agent_tokens(rec.tokens)
        if n_tokens is not None:
            agent_tokens += n_tokens
            counted += 1
    side = {h: s[0] / s[1] if s[1] else None for h, s in sums.items()}
    episodes = sums[True][1] + sums[False][1]
    return {"episodes": episodes, "hinted_mean": side[True], "unhinted_mean": side[False],
            "episode_errors": dict(errors.most_common()),
            # the Agent's side of the budget; unknown (None) when an episode carries no token ids
            "agent_tokens": agent_tokens if counted == episodes else None, "_unhinted_by_env": unhinted}


TOP_ENVS = 5  # per iteration, in top_regret.csv


def _scores(path: Path) -> dict:
    regrets, rewards, top = [], [], []
    flagged: Counter[str] = Counter()
    designs = report_curriculum.DesignScores()
    for _, _, rec in read_rows(path, expect="spade.score"):
        assert isinstance(rec, Score)
        designs.add(rec)
        if rec.regret is not None:
            regrets.append(rec.regret)
            top.append({"env_id": rec.env_id, "regret": rec.regret, "designer_reward": rec.designer_reward,
                        "flags": ",".join(rec.extra.get("flags") or [])})
        rewards.append(rec.designer_reward)
        flagged.update(rec.extra.get("flags") or [])
    top.sort(key=lambda r: (-r["regret"], r["env_id"]))
    out: dict[str, Any] = {"scored_envs": len(rewards), "regret_mean": _mean(regrets),
                           "designer_reward_mean": _mean(rewards), "flagged": dict(flagged.most_common()),
                           "top_regret": top[:TOP_ENVS], **designs.result()}
    mpath = manifest_path(path)
    if mpath.exists():
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError):
            manifest = {}
        summ, div = manifest.get("summary") or {}, manifest.get("diversity") or {}
        for key in ("vendi", "vendi_per_n"):
            value = summ.get(key, div.get(key))
            out[key] = value if isinstance(value, int | float) else None
    return out


def _flatten(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        out[prefix] = value
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)


def _update(path: Path) -> dict:
    """Numeric leaves of update.json's ``metrics``, ``roles``, ``sampler`` and ``staleness``, prefixed
    ``update.``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        _flatten("update", {k: data[k] for k in ("metrics", "roles", "sampler", "staleness") if k in data} or data, out)
    return {k.replace("update.metrics.", "update."): v for k, v in out.items()}


def _eval(path: Path) -> dict:
    out = {}
    for _, _, rec in read_rows(path, expect="spade.eval"):
        assert isinstance(rec, Eval)
        out[f"eval:{rec.task}/{rec.metric}"] = rec.value
    return out


def _probe(kind: str, figures: dict) -> dict:
    """The fixed prompt set's figures (report_curriculum.PROBE), named ``probe_*``."""
    return {f"probe_{k}": figures[k] for k in report_curriculum.PROBE[kind] if k in figures}


def _sources(layout: RunLayout, i: int) -> dict[str, list[Path]]:
    rollouts = sorted(p for p in layout.iter_dir(i).glob("rollouts*.jsonl"))
    return {
        "designs": [layout.designs(i)], "validated": [layout.validated(i)], "rollouts": rollouts,
        "scores": [layout.scores(i)], "update": [layout.ckpt(i + 1) / "update.json"], "eval": [layout.eval(i)],
        **{f"probe_{kind}": [layout.designer_probe(i) / f"{kind}.jsonl"] for kind in report_curriculum.PROBE},
    }


def _stamp(paths: list[Path]) -> list:
    """What the cache is keyed on: name, size and mtime of each file and of its manifest."""
    out = []
    for p in paths:
        for q in (p, manifest_path(p)):
            if q.exists():
                st = q.stat()
                out.append([str(q), st.st_size, st.st_mtime_ns])
    return out


def iteration_row(layout: RunLayout, i: int, cache_dir: Path | None = None) -> dict:
    """Every figure of iteration ``i`` that its finished artifacts give, as a flat dict."""
    # Only finished outputs exist under these names; a stage's .partial-* file has another one.
    sources = {k: [p for p in v if p.exists()] for k, v in _sources(layout, i).items()}
    # the env files the iteration played, for the levels of its envs (a fixed set may live outside the run)
    envs = report_curriculum.env_files(layout, i, sources["rollouts"])
    sources["envs"] = envs
    key = {"version": CACHE_VERSION, "stamp": _stamp([p for v in sources.values() for p in v])}
    cache = cache_dir / f"iter_{i:04d}.json" if cache_dir else None
    if cache and cache.exists():
        try:
            cached = json.loads(cache.read_text())
            if cached.get("key") == key:
                return cached["row"]
        except (OSError, json.JSONDecodeError):
            pass
    row: dict[str, Any] = {"iteration": i}
    readers = {"designs": _designs, "validated": _validated, "scores": _scores, "update": _update, "eval": _eval,
               "probe_validated": lambda p: _probe("validated", _validated(p)),
               "probe_scores": lambda p: _probe("scores", _scores(p))}
    for name, files in sources.items():
        if files and name != "envs":
            row.update(_rollouts(files) if name == "rollouts" else readers[name](files[0]))
    row.update(report_curriculum.frontier(row.pop("_unhinted_by_env", {}), envs))
    if cache:
        atomic_write_text(cache, json.dumps({"key": key, "row": row}) + "\n")
    return row


def engine_events(layout: RunLayout) -> dict[int, dict]:
    """Per iteration, what the run's `spade serve` servers did (RUN/serve/events.jsonl, and
    RUN/serve/NAME/events.jsonl for each server of a fleet): engine starts (restarts included) and
    checkpoint loads, counted over every server; their seconds are the slowest server's, since a
    fleet's servers start and load side by side."""
    out: dict[int, dict] = {}
    for path in [layout.serve_dir / "events.jsonl", *sorted(layout.serve_dir.glob("*/events.jsonl"))]:
        if path.exists():
            for i, row in _server_events(path).items():
                into = out.setdefault(i, {"engine_starts": 0, "engine_start_s": 0.0, "engine_loads": 0,
                                          "engine_load_s": 0.0})
                for kind in ("start", "load"):
                    into[f"engine_{kind}s"] += row[f"engine_{kind}s"]
                    into[f"engine_{kind}_s"] = max(into[f"engine_{kind}_s"], row[f"engine_{kind}_s"])
    return out


def _server_events(path: Path) -> dict[int, dict]:
    """One server's events.jsonl, summed per iteration."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
        if not isinstance(e, dict) or not isinstance(e.get("iteration"), int):
            continue
        row = out.setdefault(e["iteration"], {"engine_starts": 0, "engine_start_s": 0.0, "engine_loads": 0,
                                              "engine_load_s": 0.0})
        kind = {"start": "start", "restart": "start", "load": "load"}.get(e.get("event"))
        if kind:
            row[f"engine_{kind}s"] += 1
            row[f"engine_{kind}_s"] = round(row[f"engine_{kind}_s"] + float(e.get("seconds") or 0.0), 3)
    return out


def iterations(layout: RunLayout) -> list[int]:
    """Iterations with an iter dir, an eval file, a checkpoint or a designer probe (the final
    checkpoint has only those)."""
    found = set(layout.iterations())
    found |= {int(p.stem[5:]) for p in (layout.root / "eval").glob("iter_[0-9][0-9][0-9][0-9].jsonl")}
    found |= {int(p.name[5:]) for p in (layout.root / "designer_probe").glob("iter_[0-9][0-9][0-9][0-9]")
              if (p / "scores.jsonl").exists()}
    found |= {int(p.name[5:]) - 1 for p in (layout.root / "ckpt").glob("iter_[0-9][0-9][0-9][0-9]")
              if (p / "update.json").exists() and int(p.name[5:]) > 0}
    return sorted(found)


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items())
    return "" if value is None else value


def to_csv(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    return buf.getvalue()


def columns_of(rows: list[dict]) -> list[str]:
    """Fixed columns first (in pipeline order), then update and eval columns as they appear."""
    fixed = ["iteration", "designs", "parse_errors", "validated", "valid", "valid_rate", "invalid_reasons",
             "episodes", "agent_tokens", "unhinted_mean", "hinted_mean", "episode_errors", "scored_envs", "regret_mean",
             "designer_reward_mean", "flagged", "vendi", "vendi_per_n", *report_curriculum.COLUMNS,
             *report_curriculum.PROBE_COLUMNS]
    seen = {k for row in rows for k in row}
    rest = sorted(k for k in seen if k not in fixed)
    return [c for c in fixed if c in seen or c == "iteration"] + [c for c in rest if c.startswith("update.")] + \
        [c for c in rest if not c.startswith("update.")]


# -- plots -------------------------------------------------------------------------------------

def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["iteration"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return [p[0] for p in pts], [p[1] for p in pts]


def save_figure(fig: Any, path: Path) -> Path:
    """savefig to a temp file in the same folder, then rename: readers never see half a PNG."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    """One PNG per panel that has data: returns, validity, diversity, update, eval, designer_probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    panels = {
        "returns": [("unhinted_mean", "unhinted return"), ("hinted_mean", "hinted return"),
                    ("regret_mean", "hint-regret")],
        "validity": [("valid_rate", "valid rate")],
        "diversity": [("vendi_per_n", "Vendi / n")],
        "update": [(k, k.removeprefix("update.")) for k in ("update.loss", "update.kl", "update.entropy",
                                                           "update.grad_norm.mean", "update.clip_ratio.region")],
        "eval": [(k, k.removeprefix("eval:")) for k in sorted({k for r in rows for k in r if k.startswith("eval:")})],
        "designer_probe": [("probe_valid_rate", "valid rate"), ("probe_regret_mean", "hint-regret"),
                           ("probe_share_learnable", "share learnable")],
    }
    written = []
    for name, series in panels.items():
        present = [(k, label) for k, label in series if _series(rows, k)[0]]
        if not present:
            continue
        separate = name == "update"  # losses and norms live on different scales
        n = len(present) if separate else 1
        fig, axes = plt.subplots(n, 1, figsize=(7, 2.4 * n if separate else 3.6), squeeze=False, sharex=True)
        for j, (key, label) in enumerate(present):
            ax = axes[j if separate else 0][0]
            xs, ys = _series(rows, key)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
            ax.set_ylabel(label if separate else name)
            ax.grid(alpha=0.3)
            if not separate:
                ax.legend(fontsize=8)
        axes[-1][0].set_xlabel("iteration")
        axes[-1][0].xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(name)
        written.append(save_figure(fig, out_dir / f"{name}.png"))
        plt.close(fig)
    return written + report_curriculum.write_plots(rows, out_dir, plt, save_figure)
