"""`spade serve`: the run's one vLLM server; loads each new checkpoint into it (``stages.serve``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.backends.engine import (
    DataParallelOpt,
    EnforceEagerOpt,
    EngineArgOpt,
    EngineOptions,
    GpuMemoryOpt,
    MaxModelLenOpt,
    PrefixCachingOpt,
    TensorParallelOpt,
)
from spade_cli.cli import PANEL_HELPERS, command, console, finish

ACTIONS = ("sleep", "wake-up", "stop", "status")


def serve(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="The run directory; the state lives in RUN/serve/.",
                                          file_okay=False)],
    server: Annotated[str | None, typer.Option("--server", help="One of several servers of the run (a fleet's "
                                               "node-0, node-1, ...): its state lives in RUN/serve/NAME/.")]
    = None,
    model: Annotated[str | None, typer.Option("--model", help="Checkpoint to serve: starts the server, or "
                                              "loads it into the running one.")] = None,
    do: Annotated[str | None, typer.Option("--do", help="Instead of serving a checkpoint: sleep (release "
                                               "GPU memory), wake-up, stop or status.")] = None,
    level: Annotated[int, typer.Option("--level", min=1, max=2, help="Sleep level: 1 keeps the weights in "
                                       "CPU memory, 2 drops them (the wake reads them again).")] = 1,
    host: Annotated[str, typer.Option("--host", help="Address the server listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port the server listens on.")] = 8000,
    dtype: Annotated[str, typer.Option("--dtype", help="Weights dtype of the engine.")] = "bfloat16",
    vllm_python: Annotated[str | None, typer.Option("--vllm-python", help="Python with vLLM installed "
                                               "[default: this one].")] = None,
    sleep_mode: Annotated[bool | None, typer.Option("--sleep-mode/--no-sleep-mode", show_default=False,
                                                    help="vLLM sleep mode [default: on with GPUs].")] = None,
    wait: Annotated[float, typer.Option("--wait", min=1, help="Seconds to wait for /health at a start.")] = 900,
    iteration: Annotated[int | None, typer.Option("--iteration", help="Iteration recorded in events.jsonl.")]
    = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the engine command and start nothing.")]
    = False,
    tensor_parallel_size: TensorParallelOpt = None,
    data_parallel_size: DataParallelOpt = None,
    gpu_memory_utilization: GpuMemoryOpt = None,
    max_model_len: MaxModelLenOpt = None,
    enable_prefix_caching: PrefixCachingOpt = False,
    enforce_eager: EnforceEagerOpt = False,
    engine_arg: EngineArgOpt = None,
) -> None:
    """Serve a checkpoint from one long-lived vLLM server (OpenAI-compatible, processed log-probs,
    served as "spade"); a later call with the next checkpoint loads its weights without a restart.

    The state (URL, pid, checkpoint, fingerprint) is RUN/serve/server.json; every start, load,
    sleep and wake is timed in RUN/serve/events.jsonl. Stages sample with --backend openai
    --base-url URL --model CKPT and are refused when the server holds another checkpoint.

    Example: [bold]spade serve --run-dir runs/demo --model runs/demo/ckpt/iter_0001 --dry-run[/]

    Around an update: [bold]spade serve --run-dir runs/demo --do sleep[/]
    """
    from stages import serve as stage

    if (model is None) == (do is None):
        raise typer.BadParameter("pass --model CKPT (serve it) or --do ACTION", param_hint="--model/--do")
    if do is not None:
        if do not in ACTIONS:
            raise typer.BadParameter(f"choose one of {', '.join(ACTIONS)}", param_hint="--do")
        summary = stage.control(run_dir, do.replace("-", "_"), level=level, iteration=iteration,
                                server_name=server)
        finish(summary)
        return
    opts = EngineOptions.from_cli(tensor_parallel_size, data_parallel_size, gpu_memory_utilization, max_model_len,
                                  enable_prefix_caching, enforce_eager, engine_arg)
    try:
        stage.check_engine_args(opts.engine_args)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine-arg") from None
    summary = stage.run(model, run_dir, opts, host=host, port=port, dtype=dtype, python=vllm_python,
                        sleep_mode=sleep_mode, wait_s=wait, dry_run=dry_run, iteration=iteration,
                        server_name=server)
    if dry_run:
        console.print(summary["command"], soft_wrap=True, markup=False)
    elif summary["status"] == "ok":
        console.print(f"[green]{summary['action']}[/] {summary['checkpoint']} in {summary['seconds']:.1f} s: "
                      f"{summary['url']} (pid {summary['pid']})")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("serve", rich_help_panel=PANEL_HELPERS)(command(serve))
