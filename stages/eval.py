"""`spade eval`: score a checkpoint on held-out tasks and write one spade.eval/1 row per metric.

Inputs: a checkpoint (a Hugging Face directory or, with ``--backend openai``, the model name a
server knows) and a list of task specs (``lm:``, ``rg:``, ``envs:``, ``evalscope:``; see
``spade_cli.evaluators``). Output: ``eval.jsonl`` with rows ``{task, metric, value, stderr, n,
model, backend, harness}``, plus each harness's own files beside it (``eval.jsonl.lm_eval/``,
``eval.jsonl.rg/``, ``eval.jsonl.evalscope/``).

The unit of resumption is one task spec: its rows are appended to the partial output only once
the whole task has finished, so a run killed during the third task redoes only that task.
``compare`` puts two eval files side by side (B minus A), the basis of before/after tables.

Compared with the paper: the paper reports pass@1 over several samples on AIME; here each item is
sampled once per run (greedy by default) and the standard error is that of the item mean.

    spade eval --model runs/demo/ckpt/iter_0002 --tasks rg:basic_arithmetic:20,lm:spade_tiny_qa \\
        --out runs/demo/eval/iter_0002.jsonl --limit 20
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_cli.artifacts import SpadeError, Stage, expand_inputs, read_records
from spade_cli.evaluators import ADAPTERS, PAPER_PRESET, EvalContext, TaskSpec, parse_specs
from spade_cli.records import Eval, parse

PRESETS = {"paper": PAPER_PRESET}


def resolve_tasks(tasks: str | list[str] | None, preset: str | None) -> list[TaskSpec]:
    """The preset's specs followed by the explicit ones; ValueError when there are none."""
    texts: list[str] = []
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        texts.extend(PRESETS[preset])
    if tasks:
        texts.extend([tasks] if isinstance(tasks, str) else tasks)
    specs = parse_specs(texts)
    if not specs:
        raise ValueError("give --tasks or --preset")
    return specs


def run(model: str, tasks: list[TaskSpec], out: str | Path, *, backend: str = "hf", base_url: str | None = None,
        limit: int | None = None, batch_size: int = 8, max_tokens: int | None = None, temperature: float = 0.0,
        seed: int = 0, chat_template: bool = False, evalscope_bin: str = "evalscope", k: int = 4,
        max_turns: int = 16, force: bool = False,
        config: dict | None = None, log: Callable[[str], None] = lambda msg: None) -> dict:
    """Run every task spec not already in the partial output; returns the summary dict."""
    out = Path(out)
    inputs: dict[str, list[str | Path]] = {}
    if Path(model).is_dir():
        inputs["model"] = [model]
    suites = [spec.name for spec in tasks if spec.kind == "envs"]
    if suites:
        inputs["envs"] = expand_inputs(suites)  # names a missing suite file before any work
    cfg = config if config is not None else {
        "model": model, "tasks": [s.label for s in tasks], "backend": backend, "base_url": base_url,
        "limit": limit, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
        "chat_template": chat_template, "k": k, "max_turns": max_turns}
    stage = Stage.begin("eval", out, cfg, inputs, force=force)
    if stage.check():
        rows = read_records(out, expect="spade.eval")
        return summary(rows, out, status="up to date")
    done = [parse(r, expect="spade.eval") for r in stage.resume()]
    finished = {r.extra.get("spec") for r in done}
    ctx = EvalContext(model=model, out=out, backend=backend, base_url=base_url, limit=limit, batch_size=batch_size,
                      max_tokens=max_tokens, temperature=temperature, seed=seed, chat_template=chat_template,
                      evalscope_bin=evalscope_bin, k=k, max_turns=max_turns, force=force, log=log)
    rows = list(done)
    try:
        with stage.writer() as writer:
            for spec in tasks:
                if spec.label in finished:
                    log(f"{spec.label}: already done, skipped")
                    continue
                t0 = time.perf_counter()
                got = ADAPTERS[spec.kind](spec, ctx)
                for row in got:
                    writer.write(row)
                rows.extend(got)
                stage.timings[spec.label] = round(time.perf_counter() - t0, 3)
    finally:
        ctx.close()
    result = summary(rows, out, status="ok")
    stage.commit(len(rows), {k: v for k, v in result.items() if k != "status"})
    return result


def summary(rows: list[Eval], out: Path, status: str) -> dict:
    return {"status": status, "out": str(out), "rows": len(rows),
            "results": [{"task": r.task, "metric": r.metric, "value": r.value, "stderr": r.stderr, "n": r.n}
                        for r in rows]}


def compare(a: str | Path, b: str | Path) -> dict:
    """Join two eval files on (task, metric): values, B - A, and a z-score where both have stderr."""
    try:
        left = read_records(a, expect="spade.eval")
        right = read_records(b, expect="spade.eval")
    except FileNotFoundError as exc:
        raise SpadeError(str(exc)) from None
    index_a = {(r.task, r.metric): r for r in left}
    index_b = {(r.task, r.metric): r for r in right}
    keys = list(index_a) + [k for k in index_b if k not in index_a]
    rows: list[dict[str, Any]] = []
    for key in keys:
        ra, rb = index_a.get(key), index_b.get(key)
        va, vb = (ra.value if ra else None), (rb.value if rb else None)
        diff = vb - va if va is not None and vb is not None else None
        z = None
        if diff is not None and ra.stderr and rb.stderr:
            z = diff / math.sqrt(ra.stderr ** 2 + rb.stderr ** 2)
        rows.append({"task": key[0], "metric": key[1], "a": va, "b": vb, "diff": diff, "z": z,
                     "a_n": ra.n if ra else None, "b_n": rb.n if rb else None})
    return {"status": "ok", "a": str(a), "b": str(b), "rows": rows,
            "only_a": sum(1 for k in index_a if k not in index_b),
            "only_b": sum(1 for k in index_b if k not in index_a)}
