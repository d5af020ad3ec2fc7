"""The ``vllm`` backend: offline ``vllm.LLM`` over token-id prompts (GPU runs; the ``spade[vllm]`` extra).

``vllm`` is imported when the backend is built, never at module import, so the rest of spade
works without it. One ``generate`` call hands every prompt to the engine at once as
``TokensPrompt(prompt_token_ids=...)`` with ``SamplingParams(n=...)``; the engine schedules them
with continuous batching, so ``calls`` (engine calls) is 1 per ``generate``.

Choices that matter for RL, and why:

* ``logprobs_mode="processed_logprobs"``: the default (``raw_logprobs``) reports log-probs of the
  untempered distribution, which are not the sampler's. Processed log-probs are taken after
  temperature and top-p, the same quantity the hf backend records, so stored log-probs can serve
  as the old policy in the GRPO ratio. ``SamplingParams(logprobs=0)`` asks for the sampled token
  only.
* ``dtype`` is passed explicitly (default ``bfloat16``): ``"auto"`` runs float32 checkpoints in
  float16 on GPU, a silent mismatch with a bfloat16 trainer.
* The chat template is applied by spade (``render_chat``), never by vLLM, so prompts are the
  same ids the other backends and the trainer see.
* ``seed`` seeds the engine; ``Sampling.seed`` becomes the per-request seed, with which vLLM still
  draws ``n`` distinct samples and which makes a rerun reproduce them.

vLLM keeps the sampled EOS id in ``token_ids`` (its text leaves it out) and stops on stop strings
with ``include_stop_str_in_output=False``, matching the hf backend. vLLM starts its engine core in
a spawned process: a script that builds this backend needs an ``if __name__ == "__main__":``
guard (the ``spade`` entry point has one).

Data parallelism (``data_parallel_size`` > 1) follows vLLM's offline data-parallel pattern: one
engine process per GPU group (``CUDA_VISIBLE_DEVICES`` set to its ``tensor_parallel_size``
devices), each a plain ``vllm.LLM``; a ``generate`` call splits its prompts into contiguous
slices, one per engine, and joins the answers in order. Prompts carry their own seeds, so what a
prompt samples does not depend on which engine drew it. ``spade_cli/backends/engine.py`` picks the default
layout (every visible GPU).

    backend = VLLMBackend("ckpt/iter_0003", dtype="bfloat16", gpu_memory_utilization=0.85)
"""

from __future__ import annotations

from typing import Any

from spade_cli.backends import GenSample, Sampling

DTYPES = ("bfloat16", "float16", "float32", "auto")
_NOT_ENGINE = {"base_url", "api_key", "concurrency", "timeout", "served_model", "token_prompts", "device",
               "batch_size"}


class VLLMBackend:
    """``vllm.LLM`` behind the spade ``Backend`` interface; ``engines`` engine processes when data parallel."""

    name = "vllm"
    logprobs_mode = "processed"  # the engine is built with logprobs_mode="processed_logprobs"

    def __init__(self, model: str, dtype: str = "bfloat16", gpu_memory_utilization: float | None = 0.85,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None, seed: int = 0,
                 enforce_eager: bool = False, data_parallel_size: int = 1, **engine_kwargs: Any) -> None:
        from spade_cli.core import checkpoint
        from spade_cli.core.artifacts import SpadeError

        if dtype not in DTYPES:
            raise SpadeError(f"vllm backend: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        try:
            import vllm
        except ImportError as exc:
            raise SpadeError(f"vllm backend: cannot import vllm ({exc}); install the extra: "
                             "pip install 'spade[vllm]'") from None
        self.model = str(model)
        checkpoint.check(self.model)
        self.calls = 0
        self.llm: Any = None
        self.workers: list[Any] = []
        kwargs: dict[str, Any] = dict(model=self.model, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                                      seed=seed, enforce_eager=enforce_eager,
                                      logprobs_mode="processed_logprobs", trust_remote_code=False)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        # Stages pass one set of options to whichever backend they load; keep the engine's own.
        kwargs.update({k: v for k, v in engine_kwargs.items() if v is not None and k not in _NOT_ENGINE})
        self.engines = max(1, int(data_parallel_size))
        if self.engines == 1:
            self.llm = vllm.LLM(**kwargs)
            self.tokenizer = self.llm.get_tokenizer()
            return
        from transformers import AutoTokenizer

        from spade_cli.backends.engine import visible_gpu_ids

        ids = visible_gpu_ids()
        if len(ids) < self.engines * tensor_parallel_size:
            raise SpadeError(f"vllm backend: {self.engines} engines x {tensor_parallel_size} GPUs need "
                             f"{self.engines * tensor_parallel_size} GPUs; this job sees {len(ids)}")
        try:
            for rank in range(self.engines):
                devices = ids[rank * tensor_parallel_size:(rank + 1) * tensor_parallel_size]
                self.workers.append(_Engine(rank, devices, kwargs))
            for w in self.workers:  # the engines load side by side; wait for all of them
                w.ready()
        except BaseException:
            self.close()
            raise
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None) -> list[list[GenSample]]:
        """For every prompt, ``n`` samples, all in one call per engine (per-request seeds when given)."""
        if not prompts:
            return []
        self.calls += 1
        if self.llm is not None:
            return _generate(self.llm, prompts, n, sampling, seeds)
        size = -(-len(prompts) // len(self.workers))
        parts = [(w, prompts[i * size:(i + 1) * size], None if seeds is None else seeds[i * size:(i + 1) * size])
                 for i, w in enumerate(self.workers)]
        busy = [(w, p, s) for w, p, s in parts if p]
        for w, p, s in busy:  # all engines generate at once; answers are collected in order
            w.send(("generate", p, n, sampling, s))
        return [group for w, _, _ in busy for group in w.receive()]

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()  # frees the engine-core process now rather than at interpreter exit
        workers, self.workers = getattr(self, "workers", []), []
        for w in workers:
            w.stop()


def _generate(llm: Any, prompts: list[list[int]], n: int, sampling: Sampling,
              seeds: list[int] | None) -> list[list[GenSample]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def params(seed: int | None) -> Any:
        return SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                              max_tokens=sampling.max_tokens, seed=seed, logprobs=0,
                              stop=list(sampling.stop) or None, include_stop_str_in_output=False,
                              stop_token_ids=list(sampling.stop_token_ids) or None,
                              top_k=sampling.top_k if sampling.top_k > 0 else -1,
                              skip_special_tokens=True)

    per_prompt = [params(s) for s in seeds] if seeds is not None else params(sampling.seed)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], per_prompt, use_tqdm=False)
    return [[_sample(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]


class _Engine:
    """One data-parallel engine: a spawned process that owns a ``vllm.LLM`` on its GPU group.

    Not a daemon: vLLM starts processes of its own, which a daemonic process may not."""

    def __init__(self, rank: int, devices: list[str], kwargs: dict) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # CUDA cannot be forked; the child sets its devices first
        self.rank, self.devices = rank, devices
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_main, args=(child, devices, kwargs), name=f"spade-vllm-dp{rank}")
        self.proc.start()
        child.close()

    def send(self, msg: tuple) -> None:
        self.conn.send(msg)

    def receive(self) -> Any:
        from spade_cli.core.artifacts import SpadeError

        try:
            status, payload = self.conn.recv()
        except EOFError:
            raise SpadeError(f"vllm engine {self.rank} (GPUs {','.join(self.devices)}) exited; "
                             f"exit code {self.proc.exitcode}") from None
        if status == "error":
            raise SpadeError(f"vllm engine {self.rank} (GPUs {','.join(self.devices)}): {payload}")
        return payload

    def ready(self) -> None:
        self.receive()

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=10)


def _engine_main(conn: Any, devices: list[str], kwargs: dict) -> None:
    """The body of one engine process: build the engine, then answer generate requests until stopped."""
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    try:
        import vllm

        llm = vllm.LLM(**kwargs)
        conn.send(("ok", None))
    except Exception as exc:  # reported to the parent, which raises it as a SpadeError
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "stop":
            break
        try:
            conn.send(("ok", _generate(llm, *msg[1:])))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine is not None and hasattr(engine, "shutdown"):
        engine.shutdown()


def _sample(c: Any) -> GenSample:
    ids = [int(t) for t in c.token_ids]
    lps: list[float] | None = None
    if c.logprobs is not None and len(c.logprobs) == len(ids):
        # Each position maps token id -> Logprob; the sampled token is always among them.
        lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids, strict=True)]
    return GenSample(token_ids=ids, text=c.text, logprobs=lps,
                     finish_reason="length" if c.finish_reason == "length" else "stop",
                     extra={"stop_reason": c.stop_reason} if c.stop_reason is not None else {})
