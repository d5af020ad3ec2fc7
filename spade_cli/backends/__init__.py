"""Generation backends behind one small interface over token ids (docs/architecture.md, 'Backends').

Chat templates are applied on spade's side (``render_chat``), so hf, vllm and openai see the
same prompt ids and multi-turn environment tokens can be spliced in and masked exactly.

    backend = load_backend("hf", "ckpt/tiny")
    ids = render_chat(backend.tokenizer, messages)
    [[sample, ...]] = backend.generate([ids], n=4, sampling=Sampling(temperature=1.0, max_tokens=256))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # end a sample at any of these ids (kept, like EOS)
    top_k: int = 0  # 0: off


@dataclass
class GenSample:
    token_ids: list[int]
    text: str
    logprobs: list[float] | None  # sampler log-probs at the sampling temperature; None when unknown
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    extra: dict = field(default_factory=dict)


class Backend(Protocol):
    name: str
    model: str
    tokenizer: Any  # a transformers tokenizer with the chat template

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None) -> list[list[GenSample]]:
        """One batched call: for every prompt, ``n`` samples.

        ``seeds`` (one per prompt) make each prompt's samples depend on its own seed only, not on
        what else is in the batch: a stage resumed after a crash then samples exactly what the
        uninterrupted run would have. Without them ``Sampling.seed`` seeds the whole call."""
        ...

    def close(self) -> None: ...


def sample_seed(seed: int, j: int) -> int:
    """The seed of sample ``j`` of a prompt whose seed is ``seed`` (for backends that draw the
    ``n`` samples of a prompt as separate rows or requests)."""
    import hashlib

    return int(hashlib.sha256(f"{seed}|{j}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def render_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True,
                enable_thinking: bool = True) -> list[int]:
    """Token ids of a chat, rendered with the model's own template."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                        enable_thinking=enable_thinking)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


BACKENDS = {
    "hf": "spade_cli.backends.hf:HFBackend",
    "vllm": "spade_cli.backends.vllm:VLLMBackend",
    "openai": "spade_cli.backends.openai:OpenAIBackend",
    "fake": "spade_cli.backends.fake:FakeBackend",  # scripted outputs for tests
}


def load_backend(name: str, model: str, **kwargs: Any) -> Backend:
    """Instantiate a backend by registry name or ``module:Class`` (imports lazily)."""
    import importlib

    from spade_cli.artifacts import SpadeError

    target = BACKENDS.get(name, name)
    if ":" not in target:
        raise SpadeError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)} or module:Class")
    mod, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(mod), attr)
    except ImportError as exc:
        hint = " (install the extra: pip install 'spade[vllm]')" if name == "vllm" else ""
        raise SpadeError(f"backend {name!r} is not available here: {exc}{hint}") from None
    return cls(model, **kwargs)
