"""The evaluation adapters behind `spade eval`: one function per kind of task spec.

A task spec is ``kind:name[:N]``:

- ``lm:<task>`` runs an lm-evaluation-harness task through ``lm_eval.simple_evaluate`` (a built-in
  name such as ``aime25``, or a path to a task YAML or a folder of them). lm-eval's own results
  JSON and per-sample logs are kept in ``OUT.lm_eval/<task>/``.
- ``rg:<dataset>[:N]`` or ``rg:category:<name>[:N]`` generates N Reasoning Gym items with the run seed
  (a category's round-robin over the datasets Reasoning Gym files under it), prompts the
  model through spade's own backends with Reasoning Gym's default system prompt, extracts the
  answer (the last ``<answer>…</answer>`` after any ``</think>``, else the last non-empty line)
  and scores it with the dataset's own ``score_answer``. Per-item logs go to ``OUT.rg/``.
- ``envs:<validated.jsonl>`` plays a held-out environment suite without the hint through the
  rollout stage and reports the mean unhinted return.
- ``bfcl:multi_turn[:N]`` and ``tau2:<domain>[:N]``: BFCL v4 multi-turn and tau2-bench from their
  own packages (``spade_cli.evaluation.eval_bfcl``, ``spade_cli.evaluation.eval_tau2``).
- ``evalscope:<benchmark>`` runs an evalscope benchmark (``bfcl_v4``, ``acebench``,
  ``tau2_bench``, ``live_code_bench``) as a subprocess against an OpenAI-compatible server and
  reads its report JSON from ``OUT.evalscope/<benchmark>/``.

Reasoning budgets (``--think-tokens``, ``--answer-tokens``, ``--think-overflow``) apply to the
tasks spade generates itself (``rg:``, ``envs:``, ``bfcl:``, ``tau2:``), through
``spade_cli.backends.thinking``; ``lm:`` and ``evalscope:`` generate inside their own harness in one
phase, so ``spade eval`` refuses those flags with them (``THINKING_KINDS``).

The ``rg:`` adapter lives in ``spade_cli.evaluation.eval_rg`` (re-exported here); the ``evalscope:`` and
``envs:`` adapters live in ``stages/eval.py`` beside the registry that maps
kinds to adapters. Every adapter returns ``spade.eval/1`` rows, one per (task, metric). The tiny model in the tests
scores near zero everywhere; the point there is that the real harnesses run end to end offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import SpadeError, atomic_write_text, write_jsonl
from spade_cli.core.records import Eval
from spade_cli.evaluation.eval_rg import (  # noqa: F401  (Reasoning Gym lives there; its names stay importable from here)
    RG_GROUPS,
    extract_answer,
    rg_category,
    rg_datasets,
    rg_items,
    run_rg,
)
from spade_cli.evaluation.eval_stats import finite, mean_stderr  # noqa: F401  (re-exported)

KINDS = ("lm", "rg", "envs", "bfcl", "tau2", "evalscope")
THINKING_KINDS = ("rg", "envs", "bfcl", "tau2")  # the kinds spade generates for, two phases possible
PACKAGED_TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_tasks"
# The paper's held-out suite (docs/architecture.md, 'The method') with a sampling setting per benchmark: samples per item
# (the score is pass@1 averaged over them), temperature, max new tokens. The settings are the
# Qwen3 thinking-mode ones (temperature 0.6, 32k tokens; 16 samples on the 30-problem AIME sets,
# 4 on GPQA-Diamond and LiveCodeBench); ACEBench ships in no package, so it stays on evalscope.
_THINK = {"temperature": 0.6, "max_tokens": 32768}
PAPER_PRESET: dict[str, dict[str, Any]] = {
    "lm:spade_aime25": {**_THINK, "samples": 16},
    "lm:spade_aime26": {**_THINK, "samples": 16},
    "lm:spade_gpqa_diamond": {**_THINK, "samples": 4},
    "lm:spade_lcb_v6": {**_THINK, "samples": 4},
    "rg:category:math:200": {**_THINK, "samples": 1},
    "rg:category:logic:200": {**_THINK, "samples": 1},
    "rg:category:algorithmic:200": {**_THINK, "samples": 1},
    "rg:category:games:200": {**_THINK, "samples": 1},
    "bfcl:multi_turn": {"temperature": 0.6, "max_tokens": 8192, "samples": 1},
    "tau2:airline": {"temperature": 0.6, "max_tokens": 8192, "samples": 4},
    "tau2:retail": {"temperature": 0.6, "max_tokens": 8192, "samples": 4},
    "tau2:telecom": {"temperature": 0.6, "max_tokens": 8192, "samples": 4},
    "evalscope:acebench": {"temperature": 0.6, "max_tokens": 8192, "samples": 1},
}


@dataclass(frozen=True)
class TaskSpec:
    kind: str
    name: str
    n: int | None = None
    # Sampling settings a preset attaches ((key, value) pairs for EvalContext); not part of identity.
    settings: tuple = field(default=(), compare=False)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}" + (f":{self.n}" if self.n is not None else "")

    @property
    def slug(self) -> str:
        """A file-name-safe form of the name, for the harness's side folders."""
        base = Path(self.name).stem if "/" in self.name else self.name
        return re.sub(r"[^A-Za-z0-9._-]+", "_", base + (f"_{self.n}" if self.n is not None else ""))


def parse_spec(text: str) -> TaskSpec:
    """``lm:aime25`` -> TaskSpec; raises ValueError with a readable message (a usage error)."""
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in KINDS or not rest:
        raise ValueError(f"bad task spec {text!r}: expected one of {', '.join(k + ':<name>' for k in KINDS)}")
    n = None
    if kind in ("rg", "bfcl", "tau2"):  # kinds that take an item count: NAME[:N]
        name, colon, count = rest.rpartition(":")
        if colon and not (kind == "rg" and name == "category"):  # rg:category:NAME has no count
            if not count.isdigit() or int(count) < 1:
                raise ValueError(f"bad task spec {text!r}: the item count after the last ':' must be >= 1")
            n, rest = int(count), name
    return TaskSpec(kind, rest, n)


def check_thinking(specs: list[TaskSpec], think_tokens: int | None, overflow: str = "close") -> None:
    """ValueError when reasoning budgets are asked for tasks that cannot take them."""
    from spade_cli.backends.thinking import OVERFLOW

    if overflow not in OVERFLOW:
        raise ValueError(f"--think-overflow must be one of {', '.join(OVERFLOW)}, got {overflow!r}")
    if think_tokens is None:
        return
    harness = [s.label for s in specs if s.kind not in THINKING_KINDS]
    if harness:
        raise ValueError(f"--think-tokens applies to {', '.join(k + ':' for k in THINKING_KINDS)} tasks; "
                         f"{', '.join(harness)} generate inside their own harness in one phase (use "
                         "--max-tokens for them, in a spade eval run of their own)")


def parse_specs(texts: str | list[str]) -> list[TaskSpec]:
    """Comma-separated (or repeated) specs, in order, without duplicates."""
    parts = [texts] if isinstance(texts, str) else list(texts)
    out: list[TaskSpec] = []
    for part in parts:
        for item in part.split(","):
            if item.strip():
                spec = parse_spec(item)
                if spec not in out:
                    out.append(spec)
    return out


@dataclass
class EvalContext:
    """Everything an adapter needs besides its spec; ``out`` names the side folders."""

    model: str
    out: Path
    backend: str = "hf"
    base_url: str | None = None
    limit: int | None = None
    batch_size: int = 8
    max_tokens: int | None = None
    temperature: float = 0.0
    seed: int = 0
    chat_template: bool = False
    evalscope_bin: str = "evalscope"
    k: int = 4
    max_turns: int = 16
    samples: int = 1
    user_base_url: str | None = None  # tau2: the user simulator's OpenAI-compatible server
    user_model: str | None = None
    user_temperature: float = 0.0
    user_max_tokens: int | None = None
    max_steps: int = 100  # tau2: messages per conversation (tau2's own default)
    data_dir: str | None = None  # lm: paper tasks read their local files here instead of the hub
    top_p: float = 1.0  # tasks spade generates itself (rg, envs, bfcl, tau2)
    top_k: int = 0
    think_tokens: int | None = None  # set: reasoning and answer in two phases (spade-generated tasks)
    answer_tokens: int | None = None
    think_overflow: str = "close"
    force: bool = False
    log: Callable[[str], None] = lambda msg: None
    engine: Any = None  # spade_cli.backends.engine.EngineOptions of --backend vllm
    accept_foreign_server: bool = False
    checked: dict = field(default_factory=dict)  # what preflight found: the server, the log-prob mode
    _backend: Any = field(default=None, repr=False)

    def side_dir(self, harness: str, spec: TaskSpec) -> Path:
        return Path(f"{self.out}.{harness}") / spec.slug

    def row(self, spec: TaskSpec, metric: str, value: float | None, harness: str, stderr: float | None = None,
            n: int | None = None, task: str | None = None, **extra: Any) -> Eval:
        return Eval(task=task or spec.label, metric=metric, value=value, stderr=stderr, n=n, model=self.model,
                    backend=self.backend, harness=harness, extra={"spec": spec.label, **extra})

    def generator(self) -> Any:
        """spade's own backend, loaded once and shared by every `rg:` task."""
        if self._backend is None:
            from spade_cli.backends import load_backend

            kwargs = {"base_url": self.base_url} if self.backend == "openai" else {}
            if self.engine is not None and self.backend == "vllm":
                kwargs.update(self.engine.backend_kwargs())
            from spade_cli.backends import preflight

            backend = load_backend(self.backend, self.model, **kwargs)
            self.checked.update(preflight(backend, None, self.accept_foreign_server))
            self._backend = backend
        return self._backend

    def sampling(self, default_tokens: int) -> Any:
        """The sampling of a task spade generates: ``--max-tokens`` or the task's own cap."""
        from spade_cli.backends import Sampling

        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                        max_tokens=self.max_tokens or default_tokens, seed=self.seed)

    def thinking(self, default_tokens: int) -> Any:
        """The reasoning budgets bound to the model's tokenizer, or None without --think-tokens;
        the answer budget is ``--answer-tokens``, else the task's token cap."""
        if self.think_tokens is None:
            return None
        from spade_cli.backends.thinking import Thinking

        answer = self.answer_tokens or self.max_tokens or default_tokens
        return Thinking(self.think_tokens, answer, self.think_overflow).bind(self.generator().tokenizer)

    def replier(self, default_tokens: int) -> Any:
        """The backend a harness adapter calls: two-phase replies with --think-tokens."""
        think = self.thinking(default_tokens)
        if think is None:
            return self.generator()
        from spade_cli.backends.thinking import ThinkingBackend

        return ThinkingBackend(self.generator(), think)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


# -- lm-eval -----------------------------------------------------------------------------------

PAPER_TASKS = PACKAGED_TASKS / "paper"
# Local files by suffix -> the datasets builder that reads them.
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def paper_task(path: Path, data_dir: str | Path | None, repeats: int | None = None) -> dict:
    """One of spade's paper tasks as an lm-eval config dict (``!function`` tags resolved).

    With ``data_dir`` the hub dataset is swapped for the files named in the task's
    ``metadata.local_files`` under that folder (the hub schema, read by the matching builder);
    ``repeats`` (samples per item) replaces the task's own."""
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(path, resolve_func=True)
    local = (cfg.get("metadata") or {}).get("local_files") or {}
    if data_dir is not None and local:
        files = {split: str(Path(data_dir) / name) for split, name in local.items()}
        missing = [f for f in files.values() if not Path(f).exists()]
        if missing:
            raise SpadeError(f"lm:{cfg['task']}: --data-dir has no {', '.join(missing)}")
        cfg["dataset_path"] = _BUILDERS.get(Path(next(iter(local.values()))).suffix, "json")
        cfg.pop("dataset_name", None)
        cfg["dataset_kwargs"] = {"data_files": files}
    if repeats:
        cfg["repeats"] = repeats
    return cfg


def _local_task(spec: TaskSpec, data_dir: str | Path | None = None, repeats: int | None = None,
                ) -> tuple[list[Any], str | None]:
    """The tasks argument for a YAML/dir spec (or a bundled task name) and the include path.

    A YAML that loads as plain data is passed to lm-eval as a dict with its relative
    ``data_files`` made absolute against the YAML's folder, so it runs from any working
    directory; other YAMLs (with ``!function`` tags) go through ``include_path`` unchanged.
    spade's paper tasks (``spade_aime25``, ...) go through ``paper_task``.
    """
    import yaml

    if (PAPER_TASKS / f"{spec.name}.yaml").exists():
        return [paper_task(PAPER_TASKS / f"{spec.name}.yaml", data_dir, repeats)], None
    path = Path(spec.name)
    if not path.exists() and (PACKAGED_TASKS / f"{spec.name}.yaml").exists():
        path = PACKAGED_TASKS / f"{spec.name}.yaml"
    if not path.exists():
        return [spec.name], None
    if path.is_dir():
        return [p.stem if not _task_name(p) else _task_name(p) for p in sorted(path.glob("*.yaml"))], str(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return [_task_name(path) or path.stem], str(path.parent)
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        cfg["dataset_kwargs"]["data_files"] = {
            split: str(path.parent / f) if not Path(f).is_absolute() and (path.parent / f).exists() else f
            for split, f in files.items()}
    return [cfg], None


def _task_name(path: Path) -> str | None:
    match = re.search(r"^task:\s*(\S+)", path.read_text(), re.M)
    return match.group(1) if match else None


def _lm_model(ctx: EvalContext) -> tuple[str, dict]:
    if ctx.backend == "hf":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return "hf", {"pretrained": ctx.model, "dtype": "float32" if device == "cpu" else "auto",
                      "device": device}
    if ctx.backend == "vllm":
        args = {"pretrained": ctx.model, "dtype": "auto", "gpu_memory_utilization": 0.85, "seed": ctx.seed}
        if ctx.engine is not None:
            # lm-eval's vllm model takes the same names; only options given explicitly, because its
            # data parallelism needs ray (spade's default layout would fill every GPU through it)
            e = ctx.engine
            given = {"tensor_parallel_size": e.tensor_parallel_size, "data_parallel_size": e.data_parallel_size,
                     "gpu_memory_utilization": e.gpu_memory_utilization, "max_model_len": e.max_model_len,
                     "enable_prefix_caching": e.enable_prefix_caching, "enforce_eager": e.enforce_eager or None}
            args.update({k: v for k, v in given.items() if v is not None})
        return "vllm", args
    if ctx.backend == "openai":
        if not ctx.base_url:
            raise SpadeError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        # the same server check as spade's own tasks (a server holding another checkpoint is
        # refused); the request names what the server serves (spade serve: "spade"), and the
        # tokenizer (lm-eval's stop string) comes from the checkpoint
        served = ctx.generator().served_model
        url = ctx.base_url.rstrip("/")
        if not url.endswith("/chat/completions"):
            url += "/chat/completions"
        return "local-chat-completions", {"model": served, "base_url": url, "tokenizer": ctx.model,
                                          "tokenizer_backend": "huggingface", "tokenized_requests": False,
                                          "num_concurrent": ctx.batch_size, "max_retries": 3}
    raise SpadeError(f"lm-eval tasks support the hf, vllm and openai backends, not {ctx.backend!r}")


def lm_rows(spec: TaskSpec, ctx: EvalContext, results: dict) -> list[Eval]:
    """lm-eval's results dict -> one row per (task or group, metric, filter)."""
    rows = []
    n_samples = results.get("n-samples") or {}
    for task, metrics in (results.get("results") or {}).items():
        n = (n_samples.get(task) or {}).get("effective")
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or finite(value) is None:
                continue
            metric, _, filt = key.partition(",")
            stderr = finite(metrics.get(f"{metric}_stderr,{filt}"))
            name = metric if filt in ("none", "") else f"{metric},{filt}"
            rows.append(ctx.row(spec, name, finite(value), "lm-eval", stderr=stderr, n=n, task=f"lm:{task}"))
    return rows


def _gen_kwargs(ctx: EvalContext) -> dict | None:
    """lm-eval generation overrides: the token cap, and sampling when a temperature is set."""
    kw: dict[str, Any] = {"max_gen_toks": ctx.max_tokens} if ctx.max_tokens else {}
    if ctx.temperature > 0:
        kw.update(do_sample=True, temperature=ctx.temperature, top_p=0.95)
    return kw or None


def _task_manager(cls: Any, tasks: list[Any], include: str | None) -> Any:
    """lm-eval's task index. Indexing its ~15k built-in tasks takes ~12 s per run; a task given
    as a complete config (spade's bundled and paper tasks, a plain YAML) needs none of them."""
    if all(isinstance(t, dict) for t in tasks):
        return cls(include_defaults=False)
    return cls(include_path=include) if include else None


def run_lm(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise SpadeError(f"lm-eval is not installed here: {exc}") from None
    tasks, include = _local_task(spec, ctx.data_dir, ctx.samples if ctx.samples > 1 else None)
    model, model_args = _lm_model(ctx)
    chat = ctx.chat_template or ctx.backend == "openai"
    ctx.log(f"lm-eval {spec.label}: model={model} limit={ctx.limit} chat_template={chat}")
    try:
        results = lm_eval.simple_evaluate(
            model=model, model_args=model_args, tasks=tasks,
            task_manager=_task_manager(TaskManager, tasks, include),
            batch_size=ctx.batch_size, limit=ctx.limit, log_samples=True, apply_chat_template=chat,
            gen_kwargs=_gen_kwargs(ctx),
            random_seed=ctx.seed, numpy_random_seed=ctx.seed, torch_random_seed=ctx.seed,
            fewshot_random_seed=ctx.seed)
    except ImportError as exc:
        extra = " (pip install 'lm-eval[api]')" if ctx.backend == "openai" else ""
        raise SpadeError(f"lm-eval cannot use backend {ctx.backend!r} here: {exc}{extra}") from None
    except (KeyError, ValueError, FileNotFoundError) as exc:
        raise SpadeError(f"lm-eval could not run {spec.label}: {exc}") from None
    if not results:
        raise SpadeError(f"lm-eval returned no results for {spec.label}")
    side = ctx.side_dir("lm_eval", spec)
    samples = results.pop("samples", None) or {}
    atomic_write_text(side / "results.json", json.dumps(results, indent=2, default=str) + "\n")
    for task, items in samples.items():
        write_jsonl(side / f"samples_{task}.jsonl", [json.loads(json.dumps(s, default=str)) for s in items])
    return lm_rows(spec, ctx, results)


__all__ = ["RG_GROUPS", "extract_answer", "rg_category", "rg_datasets", "rg_items", "run_rg"]
