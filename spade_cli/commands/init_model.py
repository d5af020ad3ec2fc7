"""`spade init-model`: a random Qwen3 checkpoint with a local tokenizer, built offline, or a GGUF
file turned into a plain HF checkpoint (``--from-gguf``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal

import typer

from spade_cli.cli import PANEL_HELPERS, ConfigOpt, command, console, finish


def init_model(
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory to create.", file_okay=False)],
    size: Annotated[Literal["tiny", "small"], typer.Option("--size", help="tiny (~0.4M params, tests) or small (~13M, quickstart).")]
    = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random initialisation.")] = 0,
    from_gguf: Annotated[Path | None, typer.Option(
        "--from-gguf", help="Convert this GGUF file instead (needs spade[gguf]); --size is ignored.",
        exists=True, dir_okay=False)] = None,
    dtype: Annotated[Literal["float32", "bfloat16", "float16"], typer.Option("--dtype", help="--from-gguf: float32 is exact.")]
    = "float32",
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if OUT already holds this model.")]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Build a random-initialised Qwen3 checkpoint and byte-level BPE tokenizer, fully offline.

    The result loads with transformers, TRL, lm-eval and vLLM (head_dim 64) and has a Qwen3-style
    chat template with <think> and tool-call tokens.

    --from-gguf FILE instead dequantises a GGUF checkpoint (e.g. a real instruct model) with
    transformers' GGUF loader and saves it as a plain HF checkpoint, chat template included, that
    loads without the gguf package.

    Example: [bold]spade init-model --out ckpt/tiny --size tiny[/]
    """
    import json

    from spade_cli.core import threads
    from spade_cli.models import tinymodel

    if from_gguf is not None:
        _from_gguf(from_gguf, out, dtype, force)
        return

    if size not in tinymodel.SIZES:
        raise typer.BadParameter(f"choose one of {', '.join(tinymodel.SIZES)}", param_hint="--size")
    marker = out / "spade_init.json"
    if not force and marker.exists():
        info = json.loads(marker.read_text())
        if info.get("size") == size and info.get("seed") == seed:
            finish({"status": "up to date", "out": str(out), **info})
            return
    t0 = time.perf_counter()
    with console.status(f"building a {size} Qwen3 checkpoint in {out}"):
        summary = tinymodel.build(out, size=size, seed=seed)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    console.print(f"[green]wrote[/] {out}: {summary['params']:,} parameters, vocab {summary['vocab']}")
    finish({"status": "ok", **summary, "threads": threads.recorded()})


def _from_gguf(src: Path, out: Path, dtype: str, force: bool) -> None:
    import json

    from spade_cli.core import threads
    from spade_cli.core.artifacts import SpadeError
    from spade_cli.models import gguf

    if dtype not in gguf.DTYPES:
        raise typer.BadParameter(f"choose one of {', '.join(gguf.DTYPES)}", param_hint="--dtype")
    marker = out / "spade_init.json"
    if not force and marker.exists():
        info = json.loads(marker.read_text())
        if info.get("dtype") == dtype and info.get("gguf_sha256") == gguf.sha256(src):
            finish({"status": "up to date", "out": str(out), **info})
            return
    t0 = time.perf_counter()
    try:
        with console.status(f"dequantising {src} into {out}"):
            summary = gguf.convert(src, out, dtype=dtype)
    except ImportError as exc:
        raise SpadeError(f"--from-gguf needs the gguf package ({exc}); pip install 'spade[gguf]'") from None
    except (ValueError, OSError) as exc:
        raise SpadeError(f"cannot convert {src}: {exc}") from None
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    console.print(f"[green]wrote[/] {out}: {summary['params']:,} parameters ({summary['architecture']}, "
                  f"{dtype}), vocab {summary['vocab']}")
    finish({"status": "ok", **summary, "threads": threads.recorded()})


def register(app: typer.Typer) -> None:
    app.command("init-model", rich_help_panel=PANEL_HELPERS)(command(init_model))
