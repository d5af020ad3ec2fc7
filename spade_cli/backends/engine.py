"""vLLM engine options shared by every generating stage (design, rollout, eval) and `spade serve`.

The options carry vLLM's own names (``--tensor-parallel-size``, ``--data-parallel-size``,
``--gpu-memory-utilization``, ``--max-model-len``, ``--enable-prefix-caching``, ``--enforce-eager``)
plus ``--engine-arg KEY=VALUE`` for any other engine argument, so a user who knows ``vllm serve``
knows spade's flags. They change how fast the engine generates, not what it samples, so they are
recorded in a stage's manifest but left out of its config comparison (a rerun with more GPUs
resumes instead of refusing).

The default uses every GPU the job was given: tensor parallel 1 unless set, and data parallel over
what tensor parallel leaves (8 GPUs with ``--tensor-parallel-size 2``: 4 engines). GPUs are counted
without importing torch (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``), because a stage's
command line starts before any heavy import.

    opts = EngineOptions(tensor_parallel_size=2)
    tp, dp = opts.layout()              # on 8 GPUs: (2, 4)
    VLLMBackend(model, **opts.backend_kwargs())
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from spade_cli.core.artifacts import SpadeError

PANEL = "Engine (vllm)"
# The CLI parameter names of the engine options: how a stage runs, not what it produces.
PARAMS = ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "max_model_len",
          "enable_prefix_caching", "enforce_eager", "engine_arg")

TensorParallelOpt = Annotated[int | None, typer.Option(
    "--tensor-parallel-size", min=1, rich_help_panel=PANEL,
    help="GPUs per engine (vLLM tensor parallel) [default: 1].")]
DataParallelOpt = Annotated[int | None, typer.Option(
    "--data-parallel-size", min=1, rich_help_panel=PANEL,
    help="Engines side by side [default: visible GPUs / tensor parallel].")]
GpuMemoryOpt = Annotated[float | None, typer.Option(
    "--gpu-memory-utilization", min=0.05, max=1.0, rich_help_panel=PANEL,
    help="Share of each GPU's memory vLLM may take [default: 0.85].")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    "--max-model-len", min=16, rich_help_panel=PANEL, help="Context length [default: the model's].")]
PrefixCachingOpt = Annotated[bool, typer.Option(
    "--enable-prefix-caching", rich_help_panel=PANEL, show_default=False,
    help="Reuse the KV cache of shared prompt prefixes: vLLM's default is on, so this only says so "
    "(--engine-arg enable_prefix_caching=false turns it off).")]
EnforceEagerOpt = Annotated[bool, typer.Option(
    "--enforce-eager", rich_help_panel=PANEL, help="No CUDA graphs (faster start, slower decode).")]
ForeignServerOpt = Annotated[bool, typer.Option(
    "--foreign-server",
    help="--backend openai: accept a server that serves another checkpoint than --model "
    "(recorded in the manifest).")]
EngineArgOpt = Annotated[list[str] | None, typer.Option(
    "--engine-arg", rich_help_panel=PANEL,
    help="Any other vLLM engine argument, KEY=VALUE (VALUE read as JSON if it parses); repeat.")]


@dataclass(frozen=True)
class EngineOptions:
    """The engine settings of one stage; None means vLLM's (or spade's documented) default."""

    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_cli(cls, tensor_parallel_size: int | None = None, data_parallel_size: int | None = None,
                 gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
                 enable_prefix_caching: bool = False, enforce_eager: bool = False,
                 engine_arg: list[str] | None = None) -> EngineOptions:
        try:
            extra = parse_engine_args(engine_arg or [])
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--engine-arg") from None
        on = True if enable_prefix_caching else None
        if on and extra.get("enable_prefix_caching") is False:
            raise typer.BadParameter("--enable-prefix-caching and enable_prefix_caching=false disagree",
                                     param_hint="--engine-arg")
        if "enable_prefix_caching" in extra:  # the off switch: vLLM's default is on
            on, extra = bool(extra.pop("enable_prefix_caching")), extra
        return cls(tensor_parallel_size, data_parallel_size, gpu_memory_utilization, max_model_len,
                   on, enforce_eager, extra)

    def is_default(self) -> bool:
        return self == EngineOptions()

    def layout(self, gpus: int | None = None) -> tuple[int, int]:
        """(tensor parallel, data parallel): data parallel defaults to the GPUs tensor parallel leaves."""
        gpus = visible_gpus() if gpus is None else gpus
        tp = self.tensor_parallel_size or 1
        if self.data_parallel_size is not None:
            dp = self.data_parallel_size
        else:
            dp = max(1, gpus // tp)
        if gpus and tp * dp > gpus:
            raise SpadeError(f"--tensor-parallel-size {tp} x --data-parallel-size {dp} needs {tp * dp} GPUs; "
                             f"this job sees {gpus}")
        return tp, dp

    def backend_kwargs(self, gpus: int | None = None) -> dict[str, Any]:
        """Keyword arguments of ``VLLMBackend`` (the engine's own plus ``data_parallel_size``)."""
        tp, dp = self.layout(gpus)
        out: dict[str, Any] = {"tensor_parallel_size": tp, "data_parallel_size": dp,
                               "enforce_eager": self.enforce_eager}
        for name in ("gpu_memory_utilization", "max_model_len", "enable_prefix_caching"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **self.engine_args}

    def record(self, gpus: int | None = None) -> dict[str, Any]:
        """What a manifest records: the resolved layout and every option given."""
        tp, dp = self.layout(gpus)
        return {"tensor_parallel_size": tp, "data_parallel_size": dp,
                "gpus": visible_gpus() if gpus is None else gpus,
                **{k: v for k, v in self.backend_kwargs(gpus).items() if k not in ("tensor_parallel_size",
                                                                                    "data_parallel_size")}}

    def serve_args(self, gpus: int | None = None) -> list[str]:
        """The same options as ``vllm serve`` flags (one server; vLLM balances its DP engines)."""
        tp, dp = self.layout(gpus)
        args = ["--tensor-parallel-size", str(tp), "--data-parallel-size", str(dp)]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.enable_prefix_caching is not None:
            args.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.enforce_eager:
            args.append("--enforce-eager")
        for key, value in self.engine_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is False:
                args.append("--no-" + key.replace("_", "-"))
            else:
                args += [flag, value if isinstance(value, str) else json.dumps(value)]
        return args


# Engine arguments a stage sets itself, with the flag that sets them: passed through they would
# override it unseen (the engine arguments come last), so they are refused, naming the flag.
OWNED = {"model": "--model", "tokenizer": "--model", "served_model_name": None, "logprobs_mode": None,
         "trust_remote_code": None, "tensor_parallel_size": "--tensor-parallel-size",
         "data_parallel_size": "--data-parallel-size", "gpu_memory_utilization": "--gpu-memory-utilization",
         "max_model_len": "--max-model-len", "enforce_eager": "--enforce-eager"}


def refuse_owned(key: str, owned: dict[str, str | None]) -> None:
    """Raise ValueError when the engine argument ``key`` (``no_`` forms included) is one of ``owned``."""
    name = key.lower().removeprefix("no_")
    if name in owned:
        flag = owned[name]
        raise ValueError(f"{key} is set by spade itself" + (f": use {flag}" if flag else ", and cannot be changed"))


def parse_engine_args(items: list[str]) -> dict[str, Any]:
    """``["max_num_seqs=512", "kv-cache-dtype=fp8"]`` -> ``{"max_num_seqs": 512, "kv_cache_dtype": "fp8"}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key.isidentifier():
            raise ValueError(f"{item!r} is not KEY=VALUE (e.g. max_num_seqs=512)")
        refuse_owned(key, OWNED)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def visible_gpus() -> int:
    """GPUs this process may use, without importing torch: ``CUDA_VISIBLE_DEVICES`` when set
    (Slurm sets it), else the GPUs ``nvidia-smi -L`` lists, else 0."""
    ids = visible_gpu_ids()
    return len(ids)


def visible_gpu_ids() -> list[str]:
    """The device ids engines are pinned to: ``CUDA_VISIBLE_DEVICES``'s entries, else 0..n-1."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [x.strip() for x in env.split(",") if x.strip()]
        # "-1" or an empty value hides every GPU; CUDA stops at the first invalid entry
        return [] if not ids or ids[0].startswith("-") else ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(x for x in listing.splitlines() if x.startswith("GPU "))]


def for_backend(backend: str, opts: EngineOptions) -> EngineOptions | None:
    """The engine options a stage passes on: those of ``--backend vllm``; given to another
    backend they are a usage error (a server takes them at start: ``spade serve``)."""
    if backend == "vllm":
        return opts
    if not opts.is_default():
        raise typer.BadParameter(f"engine options apply to --backend vllm, not {backend} (a server takes "
                                 "them when it starts: spade serve)", param_hint="--tensor-parallel-size")
    return None
