"""`spade rollout`: the thin command over ``stages.rollout.run`` (options, progress, summary)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Literal

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
    IterationOpt,
    MinTier,
    ModelOpt,
    OutFileOpt,
    Tier,
    command,
    config_options,
    console,
    finish,
)
from spade_cli.commands.validate import ScratchOpt
from spade_cli.rollout.episode_state import GEN, PlayConfig


class Progress:
    """A rich bar on a TTY; otherwise a log line every ``log_every`` finished episodes."""

    def __init__(self, log_every: int) -> None:
        self.log_every, self.last_logged, self.bar, self.task = max(1, log_every), 0, None, None

    def __call__(self, stats: Any) -> None:
        elapsed = time.perf_counter() - stats.started
        tps = stats.gen_tokens / stats.gen_s if stats.gen_s else 0.0
        step_ms = 1000 * stats.env_s / stats.env_steps if stats.env_steps else 0.0
        info = f"turns {stats.turns}  gen {tps:,.0f} tok/s  env step {step_ms:.2f} ms"
        if console.is_terminal:
            if self.bar is None:
                from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as Bar

                self.bar = Bar(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console)
                self.bar.start()
                self.task = self.bar.add_task("rollout", total=stats.total, info="")
            self.bar.update(self.task, completed=stats.done, info=info)
        elif stats.done - self.last_logged >= self.log_every or (stats.done == stats.total
                                                                 and self.last_logged < stats.done):
            self.last_logged = stats.done
            console.print(f"rollout: {stats.done}/{stats.total} episodes  {info}  {elapsed:.0f}s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@config_options(PlayConfig)
def rollout(
    *,  # keyword-only: the settings' place (play) has no default of its own
    model: ModelOpt,
    envs: Annotated[list[str], typer.Option("--envs", help="Validated designs (JSONL); repeat, comma-separate or "
                                            "glob for several files, e.g. a replay file.")],
    out: OutFileOpt,
    k: Annotated[int, typer.Option("--k", min=1, help="Seed pairs per env: k unhinted + k hinted episodes.")] = 8,
    budget_pairs: Annotated[int | None, typer.Option(
        "--budget-pairs", min=1, help="Seed pairs of the whole iteration, split evenly over the valid envs "
        "(replaces --k): every arm plays the same number of episodes however many designs are valid.")] = None,
    shard: Annotated[str | None, typer.Option("--shard", help="I/N: play only shard I of N (by env_id).")]
    = None,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    play: PlayConfig,  # the episodes' settings, declared once in PlayConfig
    batching: Annotated[Literal["auto", "lockstep", "continuous"], typer.Option(
        "--batching", help="lockstep (one batched generate call per turn) or continuous (each "
        "episode advances on its own); auto: continuous for openai.", rich_help_panel=GEN)] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="hf backend weights dtype.", rich_help_panel=GEN)]
    = "float32",
    tier: Annotated[Tier, typer.Option("--tier", help="Sandbox tier (auto: strong when bubblewrap works).")] = "auto",
    min_tier: Annotated[MinTier, typer.Option("--min-tier", help="Fail closed below this tier.")]
    = "process",
    scratch_mb: ScratchOpt = 64,
    iteration: IterationOpt = 0,
    log_every: Annotated[int, typer.Option("--log-every", min=1, help="Log line every N episodes (no TTY).")]
    = 50,
    tensor_parallel_size: TensorParallelOpt = None,
    data_parallel_size: DataParallelOpt = None,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    enable_prefix_caching: PrefixCachingOpt = False,
    enforce_eager: EnforceEagerOpt = False,
    engine_arg: EngineArgOpt = None,
    foreign_server: ForeignServerOpt = False,
    force: ForceOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Play each valid environment k times without and k times with its hint, on the same seeds.

    All active episodes take a turn together (one batched generate call per turn), or with continuous batching (openai) each advances on its own; env steps run in sandboxed workers. A rerun after a crash plays only the missing episodes.

    Example: [bold]spade rollout --model ckpt/tiny --envs validated.jsonl --k 2 --max-turns 2 --max-tokens 32 --out rollouts.jsonl[/]
    """
    from stages import rollout as stage

    try:
        stage.parse_shard(shard)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shard") from None
    engine = for_backend(backend, EngineOptions.from_cli(
        tensor_parallel_size, data_parallel_size, gpu_memory_utilization, max_model_len, enable_prefix_caching,
        enforce_eager, engine_arg))
    progress = Progress(log_every)
    try:
        summary = stage.run(model, envs, Path(out), k, budget=budget_pairs, iteration=iteration, seed=play.seed, backend=backend,
                            base_url=base_url, shard=shard, play=play, tier=tier,
                            min_tier=min_tier, scratch_mb=scratch_mb, force=force, batching=batching,
                            progress=progress, engine=engine, accept_foreign_server=foreign_server,
                            backend_kwargs=({"dtype": dtype, "batch_size": play.max_concurrent}
                                            if backend == "hf" else None))
    finally:
        progress.close()
    if summary.get("status") == "ok":
        console.print(f"[green]wrote[/] {summary['out']}: {summary['episodes']} episodes of {summary['envs']} envs "
                      f"(played {summary['played']}, resumed {summary['resumed']}), returns unhinted "
                      f"{summary['unhinted_mean']} hinted {summary['hinted_mean']}, errors {summary['errors']}")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("rollout", rich_help_panel=PANEL_LOOP)(command(rollout))
