"""`spade design`: the Designer writes environments (or a fixed pool stands in for it)."""

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
    Contract,
    ForceOpt,
    IterationOpt,
    OutFileOpt,
    Overflow,
    SeedOpt,
    Signal,
    command,
    console,
    finish,
    resolved_config,
)

# Help panels keep each options table narrow enough for an 80-column terminal.
PROMPT = "Prompt"
SAMPLING = "Sampling"
THINK = "Reasoning"


def design(
    ctx: typer.Context,
    out: OutFileOpt,
    model: Annotated[str | None, typer.Option("--model", help="Designer checkpoint directory or id.")]
    = None,
    n: Annotated[int, typer.Option("--n", help="Designs to write; a multiple of --group.", min=1)] = 24,
    group: Annotated[int, typer.Option("--group", help="Samples per prompt (one GRPO group).", min=1)] = 4,
    corpus: Annotated[str | None, typer.Option(
        "--corpus", help="Grounding corpus: JSONL/Parquet file, folder, parquet:GLOB, json:GLOB or "
        "a HF dataset NAME[:CONFIG], options after ? (split, field, id, limit). Default: the bundled "
        "sample.", rich_help_panel=PROMPT)] = None,
    grounding: Annotated[bool, typer.Option(
        "--grounding/--no-grounding", help="Ground each prompt in a corpus document (ablation: off).",
        rich_help_panel=PROMPT)]
    = True,
    memory: Annotated[Path | None, typer.Option(
        "--memory", help="Environment memory (spade.memory/1 JSONL) summarised in the prompt (the "
        "memory ablation: leave it out).",
        dir_okay=False, rich_help_panel=PROMPT)] = None,
    memory_k: Annotated[int, typer.Option("--memory-k", help="Past environments listed in the prompt.",
                                          min=0, rich_help_panel=PROMPT)] = 12,
    signal: Annotated[Signal, typer.Option(
        "--signal", help="What the prompt says is rewarded.",
        rich_help_panel=PROMPT)] = "regret",
    iteration: IterationOpt = 0,
    seed: SeedOpt = 0,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature.", min=0,
                                                     rich_help_panel=SAMPLING)] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.", min=0, max=1,
                                                 rich_help_panel=SAMPLING)] = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Max new tokens per design.", min=1,
                                                       rich_help_panel=SAMPLING)]
    = 4096,
    excerpt_chars: Annotated[int, typer.Option("--excerpt-chars", help="Document excerpt length.", min=50,
                                                             rich_help_panel=PROMPT)]
    = 1500,
    top_k: Annotated[int, typer.Option("--top-k", help="Top-k sampling (0: off).", min=0,
                                       rich_help_panel=SAMPLING)] = 0,
    thinking: Annotated[bool, typer.Option(
        "--thinking/--no-thinking", help="Let the chat template open a thinking block (on, as in rollout "
        "and warmstart: Qwen3's own default; a template without thinking ignores it).", rich_help_panel=THINK)]
    = True,
    think_tokens: Annotated[int | None, typer.Option(
        "--think-tokens", min=1, help="Reasoning budget of one design; set: reasoning and answer are "
        "generated in two phases.", rich_help_panel=THINK)] = None,
    answer_tokens: Annotated[int | None, typer.Option(
        "--answer-tokens", min=1, help="Answer budget with --think-tokens (default: --max-tokens).",
        rich_help_panel=THINK)] = None,
    think_overflow: Annotated[Overflow, typer.Option(
        "--think-overflow", help="Reasoning out of budget: close (spade appends </think>, masked in "
        "the update) or end (an invalid design, parse_error think_overflow).", rich_help_panel=THINK)]
    = "close",
    pool: Annotated[str | None, typer.Option(
        "--pool", help="Fixed pool instead of a model: a folder of NAME.py + NAME.hint, 'bundled', 'starter', 'family' "
        "(generated short envs), a designs JSONL, or rg:TASK,TASK (reasoning-gym).")] = None,
    example: Annotated[bool, typer.Option(
        "--example/--no-example", help="Show a worked example from the bundled pool in the prompt "
        "(off: a compact prompt, e.g. for a small warm-started model).", rich_help_panel=PROMPT)] = True,
    contract: Annotated[Contract, typer.Option(
        "--contract", help="The system message: the environment contract in full, or short (a few "
        "lines, for a small warm-started model; use the same in `spade warmstart`), or spec: the "
        "Designer writes a one-line spec of the design space and spade writes the env "
        "(docs/curriculum.md).",
        rich_help_panel=PROMPT)] = "full",
    chunk: Annotated[int, typer.Option(
        "--chunk", help="Prompts per backend call (0: all in one call); smaller resumes finer.", min=0,
        rich_help_panel=SAMPLING)]
    = 0,
    tensor_parallel_size: TensorParallelOpt = None,
    data_parallel_size: DataParallelOpt = None,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    enable_prefix_caching: PrefixCachingOpt = False,
    enforce_eager: EnforceEagerOpt = False,
    engine_arg: EngineArgOpt = None,
    foreign_server: ForeignServerOpt = False,
    config: ConfigOpt = None,
    force: ForceOpt = False,
) -> None:
    """Sample environment designs (code + privileged hint) from the Designer, grounded in corpus
    documents and conditioned on the environment memory; or take them from a fixed pool.

    Writes --n spade.design/1 rows in --n/--group groups, all prompts in one batched backend call.
    A completion that does not parse is kept with parse_error set.

    Thinking models: --think-tokens and --answer-tokens give reasoning and answer budgets of
    their own (two phases on every backend); the row's gen records the budgets and counts.

    Example: [bold]spade design --model ckpt/tiny --n 8 --group 4 --max-tokens 64 --memory runs/demo/memory/iter_0001.jsonl --iteration 1 --out runs/demo/iter_0001/designs.jsonl[/]

    Pool baseline: [bold]spade design --pool bundled --n 8 --out designs.jsonl[/]
    """
    from stages import design as stage

    if pool is None and n % group:  # a pool has no prompts, so no groups
        raise typer.BadParameter(f"--n ({n}) must be a multiple of --group ({group})", param_hint="--n")
    if pool is None and not model:
        raise typer.BadParameter("pass --model (a Designer) or --pool (a fixed environment pool)",
                                 param_hint="--model")
    from spade_cli.designer.curriculum import SIGNALS

    if signal not in SIGNALS:
        raise typer.BadParameter(f"{signal!r} is not one of {', '.join(SIGNALS)}", param_hint="--signal")
    from spade_cli.backends.thinking import OVERFLOW

    if think_overflow not in OVERFLOW:
        raise typer.BadParameter(f"choose one of {', '.join(OVERFLOW)}", param_hint="--think-overflow")
    from spade_cli.designer.prompts import CONTRACTS

    if contract not in CONTRACTS:
        raise typer.BadParameter(f"{contract!r} is not one of {', '.join(CONTRACTS)}", param_hint="--contract")
    engine = for_backend(backend, EngineOptions.from_cli(
        tensor_parallel_size, data_parallel_size, gpu_memory_utilization, max_model_len, enable_prefix_caching,
        enforce_eager, engine_arg))
    cfg = resolved_config(ctx)
    with console.status("designing environments" if pool is None else f"reading the pool {pool}"):
        summary = stage.run(out, model=model, n=n, group=group, corpus=corpus, grounding=grounding,
                            memory=memory, iteration=iteration, seed=seed, backend=backend, base_url=base_url,
                            temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            excerpt_chars=excerpt_chars, thinking=thinking, pool=pool,
                            chunk=chunk, memory_k=memory_k, example=example, signal=signal, top_k=top_k,
                            think_tokens=think_tokens, answer_tokens=answer_tokens,
                            think_overflow=think_overflow, contract=contract, config=cfg, force=force,
                            engine=engine, accept_foreign_server=foreign_server)
    if summary.get("status") == "ok":
        parsed = summary.get("parsed", summary["rows"])
        console.print(f"[green]wrote[/] {out}: {summary['rows']} designs, {parsed} parsed")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("design", rich_help_panel=PANEL_LOOP)(command(design))
