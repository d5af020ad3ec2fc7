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

    backend = VLLMBackend("ckpt/iter_0003", dtype="bfloat16", gpu_memory_utilization=0.85)
"""

from __future__ import annotations

from typing import Any

from spade_cli.backends import GenSample, Sampling

DTYPES = ("bfloat16", "float16", "float32", "auto")
_NOT_ENGINE = {"base_url", "api_key", "concurrency", "timeout", "served_model", "token_prompts", "device",
               "batch_size"}


class VLLMBackend:
    """``vllm.LLM`` behind the spade ``Backend`` interface."""

    name = "vllm"

    def __init__(self, model: str, dtype: str = "bfloat16", gpu_memory_utilization: float | None = 0.85,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None, seed: int = 0,
                 enforce_eager: bool = False, **engine_kwargs: Any) -> None:
        from spade_cli.artifacts import SpadeError

        if dtype not in DTYPES:
            raise SpadeError(f"vllm backend: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        try:
            import vllm
        except ImportError as exc:
            raise SpadeError(f"vllm backend: cannot import vllm ({exc}); install the extra: "
                             "pip install 'spade[vllm]'") from None
        self.model = str(model)
        self.calls = 0
        kwargs: dict[str, Any] = dict(model=self.model, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                                      seed=seed, enforce_eager=enforce_eager,
                                      logprobs_mode="processed_logprobs", trust_remote_code=False)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        # Stages pass one set of options to whichever backend they load; keep the engine's own.
        kwargs.update({k: v for k, v in engine_kwargs.items() if v is not None and k not in _NOT_ENGINE})
        self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None) -> list[list[GenSample]]:
        """For every prompt, ``n`` samples, all in one engine call (per-request seeds when given)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []

        def params(seed: int | None) -> Any:
            return SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                  max_tokens=sampling.max_tokens, seed=seed, logprobs=0,
                                  stop=list(sampling.stop) or None, include_stop_str_in_output=False,
                                  stop_token_ids=list(sampling.stop_token_ids) or None,
                                  top_k=sampling.top_k if sampling.top_k > 0 else -1,
                                  skip_special_tokens=True)

        per_prompt = [params(s) for s in seeds] if seeds is not None else params(sampling.seed)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], per_prompt,
                                 use_tqdm=False)
        self.calls += 1
        return [[_sample(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()  # frees the engine-core process now rather than at interpreter exit


def _sample(c: Any) -> GenSample:
    ids = [int(t) for t in c.token_ids]
    lps: list[float] | None = None
    if c.logprobs is not None and len(c.logprobs) == len(ids):
        # Each position maps token id -> Logprob; the sampled token is always among them.
        lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids, strict=True)]
    return GenSample(token_ids=ids, text=c.text, logprobs=lps,
                     finish_reason="length" if c.finish_reason == "length" else "stop",
                     extra={"stop_reason": c.stop_reason} if c.stop_reason is not None else {})
