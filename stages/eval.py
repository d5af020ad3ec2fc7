"""`spade eval`: score a checkpoint on held-out tasks and write one spade.eval/1 row per metric.

Inputs: a checkpoint (a Hugging Face directory or hub id; with ``--backend openai``, the checkpoint
the server serves, whose tokenizer is loaded and which the server is checked against) and a list
of task specs (``lm:``, ``rg:``, ``envs:``, ``bfcl:``, ``tau2:``, ``evalscope:``; see
``spade_cli.evaluation.evaluators``, ``spade_cli.evaluation.eval_bfcl``,
``spade_cli.evaluation.eval_tau2``). Output: ``eval.jsonl`` with rows ``{task, metric, value, stderr, n,
model, backend, harness}``, plus each harness's own files beside it (``eval.jsonl.lm_eval/``,
``eval.jsonl.rg/``, ``eval.jsonl.bfcl/``, ``eval.jsonl.tau2/``, ``eval.jsonl.evalscope/``).

The unit of resumption is one task spec: its rows are appended to the partial output only once
the whole task has finished, so a run killed during the third task redoes only that task.
``compare`` puts two eval files side by side (B minus A), the basis of before/after tables.

The ``lm:`` and ``rg:`` adapters live in ``spade_cli.evaluation.evaluators``; the ``evalscope:`` adapter (a
subprocess against an OpenAI-compatible server) and the ``envs:`` adapter (the rollout core) are
here, with ``ADAPTERS``, the registry from spec kind to adapter.

Compared with the paper: the paper reports pass@1 averaged over several samples per item; here
``--samples`` (default 1, greedy) sets that for ``rg:``, ``bfcl:`` and ``tau2:``, and the
standard error is that of the item mean.

    spade eval --model runs/demo/ckpt/iter_0002 --tasks rg:basic_arithmetic:20,lm:spade_tiny_qa \\
        --out runs/demo/eval/iter_0002.jsonl --limit 20
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import InputError, SpadeError, Stage, expand_inputs, read_records, read_rows
from spade_cli.core.errors import check_rows
from spade_cli.core.records import Eval, parse
from spade_cli.evaluation.evaluators import (
    PAPER_PRESET,
    EvalContext,
    TaskSpec,
    check_thinking,
    finite,
    mean_stderr,
    parse_spec,
    parse_specs,
    run_lm,
    run_rg,
)


def run_bfcl(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    from spade_cli.evaluation.eval_bfcl import (
        run_bfcl as adapter,  # bfcl-eval is imported only when asked for
    )

    return adapter(spec, ctx)


def run_tau2(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    from spade_cli.evaluation.eval_tau2 import (
        run_tau2 as adapter,  # tau2 and LiteLLM are imported only when asked for
    )

    return adapter(spec, ctx)

PRESETS = {"paper": PAPER_PRESET}
# Extra dataset arguments evalscope needs to match the paper's versions of its benchmarks.
EVALSCOPE_DATASET_ARGS = {"live_code_bench": {"subset_list": ["release_v6"]}}


# -- evalscope ---------------------------------------------------------------------------------

def evalscope_command(spec: TaskSpec, ctx: EvalContext, work_dir: Path) -> list[str]:
    """The `evalscope eval` command line for one benchmark against an OpenAI-compatible server."""
    if not ctx.base_url:
        raise SpadeError(f"{spec.label} talks to an OpenAI-compatible server: pass --base-url "
                         "(e.g. http://127.0.0.1:8000/v1 from `vllm serve`)")
    gen = {"temperature": ctx.temperature, "seed": ctx.seed}
    if ctx.max_tokens:
        gen["max_tokens"] = ctx.max_tokens
    # --backend openai: the server is checked as for spade's own tasks, and asked for the name it
    # serves (spade serve's fixed "spade", which is not the checkpoint path)
    name = ctx.generator().served_model if ctx.backend == "openai" else ctx.model
    cmd = [*ctx.evalscope_bin.split(), "eval", "--model", name, "--api-url", ctx.base_url.rstrip("/"),
           "--api-key", os.environ.get("OPENAI_API_KEY", "EMPTY"), "--eval-type", "openai_api",
           "--datasets", spec.name, "--work-dir", str(work_dir),
           "--seed", str(ctx.seed), "--eval-batch-size", str(ctx.batch_size),
           "--generation-config", json.dumps(gen)]
    if spec.name in EVALSCOPE_DATASET_ARGS:
        cmd += ["--dataset-args", json.dumps({spec.name: EVALSCOPE_DATASET_ARGS[spec.name]})]
    if ctx.limit:
        cmd += ["--limit", str(ctx.limit)]
    return [*cmd, "--no-timestamp"]  # results land in work_dir itself, where spade reads them


def evalscope_rows(spec: TaskSpec, ctx: EvalContext, work_dir: Path) -> list[Eval]:
    """Rows from evalscope's ``reports/<model>/<dataset>.json`` (report schema v1 or v2)."""
    rows = []
    for path in sorted(work_dir.rglob("reports/**/*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpadeError(f"{path}: unreadable evalscope report: {exc}") from None
        for metric in report.get("metrics") or []:
            ident = metric.get("identity") or {}
            name = metric.get("legacy_name") or metric.get("name") or ident.get("name") or "score"
            dims = ident.get("dimensions") or {}
            if dims:
                name += "," + ",".join(f"{k}={v}" for k, v in sorted(dims.items()))
            rows.append(ctx.row(spec, name, finite(metric.get("score")), "evalscope", n=metric.get("num"),
                                report=str(path)))
    if not rows:
        raise SpadeError(f"{spec.label}: evalscope wrote no report under {work_dir}")
    return rows


def run_evalscope(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    work_dir = ctx.side_dir("evalscope", spec)
    cmd = evalscope_command(spec, ctx, work_dir)
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        raise SpadeError(f"{spec.label} needs evalscope ({cmd[0]!r} not found): install it in its own "
                         "environment (pip install 'evalscope[app]') and pass --evalscope-bin PATH")
    ctx.log("running " + " ".join(cmd))
    work_dir.mkdir(parents=True, exist_ok=True)
    with open(work_dir / "spade_evalscope.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SpadeError(f"{spec.label}: evalscope exited {proc.returncode}; see {work_dir / 'spade_evalscope.log'}")
    return evalscope_rows(spec, ctx, work_dir)


# -- held-out environments ---------------------------------------------------------------------

def check_suite(path: Path) -> None:
    """Refuse a held-out suite with nothing to play, before a model loads: it would score n=0 and
    pass quietly. Its rows are decoded here too, so a bad row is named by file and line at once."""
    if not any(rec.valid for _, _, rec in read_rows(path, expect="spade.validation")):
        raise InputError(path, None, "the env suite holds no valid environment (no spade.validation/1 row "
                         "with valid: true)")


def run_envs(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    """Mean unhinted return over a held-out suite, played by the rollout stage's own core
    (``spade_cli.rollout.play_envs``).

    The rollout core plays every env k times without the hint and k times with it on the same
    seeds; the unhinted mean is the score, the hinted mean is kept as a second metric. Its
    episodes go to ``OUT.envs/<suite>.rollouts.jsonl``, resumable like any rollout.
    """
    try:
        from spade_cli.rollout import play_envs as rollout
        from spade_cli.rollout.episodes import PlayConfig
        from spade_cli.sandbox import SandboxPool  # noqa: F401 - the rollout core needs it
    except ImportError as exc:
        raise SpadeError(f"envs: tasks need the rollout stage and the sandbox, missing here: {exc}") from None

    suite = Path(spec.name)
    if not suite.exists():
        raise SpadeError(f"{spec.label}: no such file")
    out = ctx.side_dir("envs", spec).with_suffix(".rollouts.jsonl")
    play = PlayConfig(max_turns=ctx.max_turns, max_tokens=ctx.max_tokens or 512,
                      temperature=ctx.temperature, top_p=ctx.top_p, top_k=ctx.top_k, seed=ctx.seed,
                      think_tokens=ctx.think_tokens, answer_tokens=ctx.answer_tokens,
                      think_overflow=ctx.think_overflow)
    rollout.run(ctx.model, [suite], out, k=ctx.k, seed=ctx.seed, backend=ctx.backend, base_url=ctx.base_url,
                play=play, force=ctx.force, backend_obj=ctx.generator())

    episodes = read_records(out, expect="spade.rollout")
    rows = []
    for side, hinted in (("unhinted_return", False), ("hinted_return", True)):
        values = [e.return_ for e in episodes if e.hinted is hinted]
        mean, stderr = mean_stderr(values)
        rows.append(ctx.row(spec, side, mean, "spade-rollout", stderr=stderr, n=len(values),
                            envs=len({e.env_id for e in episodes}), k=ctx.k,
                            episodes=os.path.relpath(out, Path(ctx.out).parent)))
    return rows


ADAPTERS: dict[str, Callable[[TaskSpec, EvalContext], list[Eval]]] = {
    "lm": run_lm, "rg": run_rg, "envs": run_envs, "bfcl": run_bfcl, "tau2": run_tau2,
    "evalscope": run_evalscope,
}


def resolve_tasks(tasks: str | list[str] | None, preset: str | None) -> list[TaskSpec]:
    """The preset's specs followed by the explicit ones; ValueError when there are none."""
    specs: list[TaskSpec] = []
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        specs = [replace(parse_spec(text), settings=tuple(sorted(cfg.items())))
                 for text, cfg in PRESETS[preset].items()]
    if tasks:
        specs += [s for s in parse_specs([tasks] if isinstance(tasks, str) else tasks) if s not in specs]
    if not specs:
        raise ValueError("give --tasks or --preset")
    return specs


def run(model: str, tasks: list[TaskSpec], out: str | Path, *, backend: str = "hf", base_url: str | None = None,
        limit: int | None = None, batch_size: int = 8, max_tokens: int | None = None, temperature: float = 0.0,
        seed: int = 0, chat_template: bool = False, evalscope_bin: str = "evalscope", k: int = 4,
        max_turns: int = 16, samples: int = 1, user_base_url: str | None = None, user_model: str | None = None,
        user_temperature: float = 0.0, user_max_tokens: int | None = None, max_steps: int = 100, data_dir: str | None = None,
        top_p: float = 1.0, top_k: int = 0, think_tokens: int | None = None, answer_tokens: int | None = None,
        think_overflow: str = "close", force: bool = False,
        config: dict | None = None, engine: Any = None,
        accept_foreign_server: bool = False, log: Callable[[str], None] = lambda msg: None) -> dict:
    """Run every task spec not already in the partial output; returns the summary dict."""
    try:
        check_thinking(tasks, think_tokens, think_overflow)
    except ValueError as exc:
        raise SpadeError(str(exc)) from None
    check_rows(samples, f"--samples {samples}", "samples of one item", "lower it")  # one generate call
    check_rows(2 * k, f"--k {k}", "episodes", "lower it")  # envs: tasks, checked again over the suite by rollout
    out = Path(out)
    inputs: dict[str, list[str | Path]] = {}
    if Path(model).is_dir():
        inputs["model"] = [model]
    suites = [spec.name for spec in tasks if spec.kind == "envs"]
    if suites:
        inputs["envs"] = expand_inputs(suites)  # names a missing suite file before any work
        for suite in inputs["envs"]:
            check_suite(Path(suite))
    if data_dir and any(p.is_file() for p in Path(data_dir).iterdir()):
        # Local benchmark files are hashed like any input: an edited copy is a different eval.
        inputs["data"] = sorted(p for p in Path(data_dir).iterdir() if p.is_file())
    cfg = config if config is not None else {
        "model": model, "tasks": [s.label for s in tasks], "backend": backend, "base_url": base_url,
        "limit": limit, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
        "chat_template": chat_template, "k": k, "max_turns": max_turns, "samples": samples,
        "user_base_url": user_base_url, "user_model": user_model, "user_temperature": user_temperature,
        "user_max_tokens": user_max_tokens, "max_messages": max_steps, "data_dir": data_dir, "top_p": top_p,
        "top_k": top_k, "think_tokens": think_tokens, "answer_tokens": answer_tokens,
        "think_overflow": think_overflow}
    stage = Stage.begin("eval", out, cfg, inputs, force=force)
    if stage.check():
        rows = read_records(out, expect="spade.eval")
        return summary(rows, out, status="up to date")
    done = [parse(r, expect="spade.eval") for r in stage.resume()]
    finished = {r.extra.get("spec") for r in done}
    ctx = EvalContext(model=model, out=out, backend=backend, base_url=base_url, limit=limit, batch_size=batch_size,
                      max_tokens=max_tokens, temperature=temperature, seed=seed, chat_template=chat_template,
                      evalscope_bin=evalscope_bin, k=k, max_turns=max_turns, samples=samples, user_base_url=user_base_url,
                      user_model=user_model, user_temperature=user_temperature, user_max_tokens=user_max_tokens,
                      max_steps=max_steps, data_dir=data_dir, top_p=top_p, top_k=top_k,
                      think_tokens=think_tokens, answer_tokens=answer_tokens, think_overflow=think_overflow,
                      force=force, log=log, engine=engine if backend == "vllm" else None,
                      accept_foreign_server=accept_foreign_server)
    rows = list(done)
    if ctx.engine is not None:
        stage.extra["engine"] = ctx.engine.record()
    try:
        with stage.writer() as writer:
            for spec in tasks:
                if spec.label in finished:
                    log(f"{spec.label}: already done, skipped")
                    continue
                t0 = time.perf_counter()
                sctx = with_settings(ctx, spec)
                got = ADAPTERS[spec.kind](spec, sctx)
                ctx._backend = sctx._backend  # a backend a preset's copy loaded is shared and closed once
                for row in got:
                    writer.write(row)
                rows.extend(got)
                stage.timings[spec.label] = round(time.perf_counter() - t0, 3)
    finally:
        ctx.close()
    if ctx.checked.get("server"):
        stage.extra["server"] = ctx.checked["server"]
    result = summary(rows, out, status="ok")
    if ctx.checked:
        result["logprobs"] = ctx.checked.get("logprobs")
    stage.commit(len(rows), {k: v for k, v in result.items() if k != "status"})
    return result


def with_settings(ctx: EvalContext, spec: TaskSpec) -> EvalContext:
    """The context a preset's spec runs under: its samples, temperature and token cap
    (``--max-tokens``, when given, caps the preset's: a quick look at the whole suite)."""
    if not spec.settings:
        return ctx
    cfg = dict(spec.settings)
    if ctx.max_tokens and cfg.get("max_tokens"):
        cfg["max_tokens"] = min(cfg["max_tokens"], ctx.max_tokens)
    return replace(ctx, **cfg)


def summary(rows: list[Eval], out: Path, status: str) -> dict:
    return {"status": status, "out": str(out), "rows": len(rows),
            "results": [{"task": r.task, "metric": r.metric, "value": r.value, "stderr": r.stderr, "n": r.n}
                        for r in rows]}


def _episode_returns(eval_file: Path, row: Any) -> dict[tuple, float] | None:
    """An ``envs:`` row's episode returns by (env_id, seed, pair), for its side (hinted or not)."""
    rel = (row.extra or {}).get("episodes") if row else None
    if not rel or row.metric not in ("unhinted_return", "hinted_return"):
        return None
    path = eval_file.parent / rel
    if not path.is_file():
        return None
    hinted = row.metric == "hinted_return"
    return {(e.env_id, e.seed, e.pair): e.return_ for e in read_records(path, expect="spade.rollout")
            if e.hinted is hinted}


def _paired(a_eps: dict[tuple, float] | None, b_eps: dict[tuple, float] | None) -> dict[str, Any]:
    """B - A over the episodes both files played (the same env, seed and pair): a held-out suite
    evaluated twice with one --seed plays the same seeds, and pairing removes the seed-to-seed
    spread that the unpaired z carries twice."""
    if not a_eps or not b_eps:
        return {}
    keys = sorted(set(a_eps) & set(b_eps))
    diff, stderr = mean_stderr([b_eps[k] - a_eps[k] for k in keys])
    z = diff / stderr if diff is not None and stderr else None
    return {"paired_n": len(keys), "paired_diff": diff, "paired_stderr": stderr, "paired_z": z}


def compare(a: str | Path, b: str | Path) -> dict:
    """Join two eval files on (task, metric): values, B - A, and a z-score where both have stderr;
    ``envs:`` rows whose episodes are still beside their eval files also get the paired figures."""
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
                     "a_n": ra.n if ra else None, "b_n": rb.n if rb else None,
                     **_paired(_episode_returns(Path(a), ra), _episode_returns(Path(b), rb))})
    return {"status": "ok", "a": str(a), "b": str(b), "rows": rows,
            "only_a": sum(1 for k in index_a if k not in index_b),
            "only_b": sum(1 for k in index_b if k not in index_a)}
