"""`spade eval`: a checkpoint on held-out tasks, or two eval files side by side (``--compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.backends.engine import (
    DataParallelOpt,
    EnforceEagerOpt,
    EngineArgOpt,
    EngineOptions,
    ForeignServerOpt,
    GpuMemoryOpt,
    MaxModelLenOpt,
    PrefixCachingOpt,
    TensorParallelOpt,
    for_backend,
)
from spade_cli.cli import (
    PANEL_LOOP,
    BackendOpt,
    BaseUrlOpt,
    ConfigOpt,
    ForceOpt,
    Overflow,
    SeedOpt,
    command,
    console,
    finish,
    resolved_config,
)

GEN = "Generation"


def _fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.4f}" if signed else f"{v:.4f}"


def _show_compare(result: dict) -> None:
    from rich.table import Table

    t = Table(title=f"A = {result['a']}\nB = {result['b']}", title_justify="left")
    for col, just in (("task", "left"), ("metric", "left"), ("A", "right"), ("B", "right"),
                      ("B - A", "right"), ("z", "right"), ("z paired", "right")):
        t.add_column(col, justify=just)
    for r in result["rows"]:
        diff = _fmt(r["diff"], signed=True)
        if r["diff"] is not None and r["diff"] != 0:
            diff = f"[{'green' if r['diff'] > 0 else 'red'}]{diff}[/]"
        z, zp = r["z"], r.get("paired_z")
        t.add_row(r["task"], r["metric"], _fmt(r["a"]), _fmt(r["b"]), diff,
                  "-" if z is None else f"{z:+.2f}", "-" if zp is None else f"{zp:+.2f} (n={r['paired_n']})")
    console.print(t)


def _show_results(result: dict) -> None:
    from rich.table import Table

    t = Table(title=result["out"], title_justify="left")
    for col in ("task", "metric", "value", "stderr", "n"):
        t.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for r in result["results"]:
        t.add_row(r["task"], r["metric"], _fmt(r["value"]), _fmt(r["stderr"]), str(r["n"] or "-"))
    console.print(t)


def eval_(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="Checkpoint directory or hub id (with "
                                              "--backend openai: the checkpoint the server serves).")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task specs: lm:TASK "
                                              "(a name or YAML), rg:DATASET[:N], rg:category:NAME[:N], "
                                              "envs:FILE, bfcl:multi_turn[:N], tau2:DOMAIN[:N], "
                                              "evalscope:NAME.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output eval.jsonl (written atomically).",
                                             dir_okay=False)] = None,
    preset: Annotated[str | None, typer.Option("--preset", help="A named task list: 'paper' (the paper's "
                                               "held-out suite with its per-benchmark samples, temperature and "
                                               "max tokens; implies --chat-template).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most N items per task.")] = None,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per generate call "
                                            "(lm-eval batch size; concurrent requests for openai).")] = 8,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Generation cap per item "
                                                   "(default: the task's own; 8192 for rg:).",
                                                   rich_help_panel=GEN)] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Sampling temperature for rg:, "
                                               "bfcl:, tau2:, lm: and evalscope: tasks (0 = greedy).",
                                               rich_help_panel=GEN)] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus mass for the tasks "
                                         "spade generates (rg:, envs:, bfcl:, tau2:).", rich_help_panel=GEN)] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Top-k for those tasks (0: off).",
                                       rich_help_panel=GEN)] = 0,
    think_tokens: Annotated[int | None, typer.Option(
        "--think-tokens", min=1, help="Reasoning budget of one reply for rg:, envs:, bfcl:, tau2: "
        "(two phases); refused with lm: and evalscope:, whose harness generates in one phase.",
        rich_help_panel=GEN)] = None,
    answer_tokens: Annotated[int | None, typer.Option(
        "--answer-tokens", min=1, help="Answer budget with --think-tokens (default: --max-tokens, "
        "else the task's cap).", rich_help_panel=GEN)] = None,
    think_overflow: Annotated[Overflow, typer.Option(
        "--think-overflow", help="Reasoning out of budget: close (spade appends </think>) or end "
        "(no answer: scored wrong).", rich_help_panel=GEN)] = "close",
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template", help="Apply the "
                                                "model's chat template in lm-eval tasks.")] = False,
    evalscope_bin: Annotated[str, typer.Option("--evalscope-bin", help="The evalscope executable (it "
                                               "lives in its own environment).")] = "evalscope",
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per item for rg:, bfcl:, tau2: and lm:spade_* "
                                         "tasks (the score averages them; use --temperature > 0).")] = 1,
    user_base_url: Annotated[str | None, typer.Option("--user-base-url", help="tau2: the user simulator's "
                                                      "OpenAI-compatible server (its /v1 URL).")] = None,
    user_model: Annotated[str | None, typer.Option("--user-model", help="tau2: the model name that server "
                                                   "knows.")] = None,
    user_temperature: Annotated[float, typer.Option("--user-temperature", min=0.0, help="tau2: the user "
                                                    "simulator's temperature.")] = 0.0,
    user_max_tokens: Annotated[int | None, typer.Option("--user-max-tokens", min=1, help="tau2: cap per user "
                                                        "reply (default: the server's).")] = None,
    max_messages: Annotated[int, typer.Option("--max-messages", min=1, help="tau2: messages per conversation.")] = 100,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Local copies of the paper's datasets "
                                                  "(aime25.jsonl, aime26.jsonl, gpqa_diamond.csv, lcb_v6.jsonl) "
                                                  "for lm:spade_* tasks, instead of the hub.", exists=True,
                                                  file_okay=False)] = None,
    k: Annotated[int, typer.Option("--k", min=1, help="Episodes per env and side for envs: tasks.")] = 4,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Turn cap for envs: tasks.")] = 16,
    compare: Annotated[tuple[Path, Path] | None, typer.Option("--compare", help="Compare two eval "
                                                              "files A B instead (prints B - A).",
                                                              exists=True, dir_okay=False)] = None,
    tensor_parallel_size: TensorParallelOpt = None,
    data_parallel_size: DataParallelOpt = None,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    enable_prefix_caching: PrefixCachingOpt = False,
    enforce_eager: EnforceEagerOpt = False,
    engine_arg: EngineArgOpt = None,
    foreign_server: ForeignServerOpt = False,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Evaluate a checkpoint on lm-eval, Reasoning Gym, BFCL, tau2-bench, held-out env and evalscope tasks.

    Writes one spade.eval/1 row per (task, metric) to --out and keeps each harness's own result
    files beside it (OUT.lm_eval/, OUT.rg/, OUT.bfcl/, OUT.tau2/, OUT.evalscope/).

    Example: [bold]spade eval --model ckpt/tiny --tasks rg:basic_arithmetic:4,lm:spade_tiny_qa
    --max-tokens 16 --out eval.jsonl[/]

    Compare: [bold]spade eval --compare runs/demo/eval/iter_0000.jsonl runs/demo/eval/iter_0001.jsonl[/]
    """
    from stages import eval as stage

    if compare is not None:
        result = stage.compare(*compare)
        _show_compare(result)
        finish(result)
        return
    if model is None or out is None:
        raise typer.BadParameter("--model and --out are required (or use --compare A B)")
    if backend not in ("hf", "vllm", "openai"):
        raise typer.BadParameter("choose hf, vllm or openai", param_hint="--backend")
    try:
        specs = stage.resolve_tasks(tasks, preset)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tasks") from None
    from spade_cli.evaluation.evaluators import check_thinking

    try:
        check_thinking(specs, think_tokens, think_overflow)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--think-tokens") from None
    if any(s.kind == "evalscope" for s in specs) and not base_url:
        raise typer.BadParameter("evalscope: tasks need an OpenAI-compatible server", param_hint="--base-url")
    if any(s.kind == "tau2" for s in specs) and not (user_base_url and user_model):
        raise typer.BadParameter("tau2: tasks need a user simulator (an OpenAI-compatible server)",
                                 param_hint="--user-base-url and --user-model")
    engine = for_backend(backend, EngineOptions.from_cli(
        tensor_parallel_size, data_parallel_size, gpu_memory_utilization, max_model_len, enable_prefix_caching,
        enforce_eager, engine_arg))
    cfg = resolved_config(ctx)
    cfg.pop("compare", None)
    cfg.pop("evalscope_bin", None)
    result = stage.run(model, specs, out, backend=backend, base_url=base_url, limit=limit, batch_size=batch_size,
                       max_tokens=max_tokens, temperature=temperature, seed=seed,
                       chat_template=chat_template or preset == "paper", evalscope_bin=evalscope_bin,
                       k=k, max_turns=max_turns, samples=samples,
                       user_base_url=user_base_url, user_model=user_model, user_temperature=user_temperature,
                       user_max_tokens=user_max_tokens, max_steps=max_messages,
                       data_dir=str(data_dir) if data_dir else None, top_p=top_p, top_k=top_k,
                       think_tokens=think_tokens, answer_tokens=answer_tokens, think_overflow=think_overflow,
                       force=force, config=cfg, engine=engine,
                       accept_foreign_server=foreign_server, log=lambda msg: console.print(msg, soft_wrap=True))
    if result["status"] != "up to date":
        _show_results(result)
    finish(result)


def register(app: typer.Typer) -> None:
    app.command("eval", rich_help_panel=PANEL_LOOP)(command(eval_))
