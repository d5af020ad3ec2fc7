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


LOGPROB_MODES = ("processed", "raw", "none")


def logprobs_mode(backend: Any) -> str:
    """What a backend's ``GenSample.logprobs`` are: ``processed`` (the sampler's, after temperature,
    top-p and top-k), ``raw`` (the untempered model's: the sampler's only at temperature 1 without
    truncation) or ``none`` (no log-probs). A backend says so in its ``logprobs_mode``; one that
    does not is taken at its word that its log-probs are the sampler's."""
    mode = getattr(backend, "logprobs_mode", None)
    return mode if mode in LOGPROB_MODES else "processed"


def sampling_record(sampling: Sampling, backend: Any) -> dict:
    """How a row was sampled, as rows record it (``gen`` of a design, the ``sampling`` field of an
    episode): ``spade update`` reads the row, not its file's manifest."""
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "logprobs": logprobs_mode(backend), "backend": getattr(backend, "name", "custom")}


def preflight(backend: Any, sampling: Sampling | None, accept_foreign: bool = False) -> dict:
    """Checks a stage makes before it samples; returns what its manifest and summary record.

    A server (openai backend) must serve the stage's checkpoint (``check_server``). With
    ``sampling`` (the stages whose rows are trained on), top-p or top-k sampling needs the
    sampler's log-probs, since the update can only correct for a truncated distribution it
    knows: with raw or no log-probs it is refused here, not after the whole rollout."""
    from spade_cli.core.artifacts import SpadeError

    info: dict[str, Any] = {}
    if hasattr(backend, "check_server"):
        info["server"] = backend.check_server(accept_foreign)
    info["logprobs"] = mode = logprobs_mode(backend)
    if sampling is not None and (sampling.top_p < 1.0 or sampling.top_k > 0) and mode != "processed":
        where = f" at {info['server']['url']}" if "server" in info else ""
        raise SpadeError(f"top-p {sampling.top_p:g} / top-k {sampling.top_k} sampling needs the sampler's "
                         f"log-probs for the update to train on, but the {getattr(backend, 'name', 'custom')} "
                         f"backend{where} returns {mode} log-probs. Sample with --top-p 1 --top-k 0, or from a "
                         "server with processed log-probs (spade serve; vllm serve --logprobs-mode "
                         "processed_logprobs)")
    return info


def sample_seed(seed: int, j: int) -> int:
    """The seed of sample ``j`` of a prompt whose seed is ``seed`` (for backends that draw the
    ``n`` samples of a prompt as separate rows or requests)."""
    import hashlib

    return int(hashlib.sha256(f"{seed}|{j}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def prompt_key(prompt: list[int]) -> str:
    """A prompt's routing key when its caller names none (``generate(keys=...)``): its content."""
    import hashlib

    return hashlib.sha256(",".join(map(str, prompt)).encode()).hexdigest()[:16]


def keyed(backend: Any, keys: list[str] | None) -> dict:
    """``keys=`` for a backend that routes requests by key (``routes_by_key``: the openai backend pins
    each key to one of a server's data-parallel engines, so an episode's turns find its prefix
    cached); nothing for the others, whose ``generate`` takes no keys."""
    return {"keys": keys} if keys is not None and getattr(backend, "routes_by_key", False) else {}


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

    from spade_cli.core.artifacts import SpadeError

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


# The libraries each backend imports when it is built (the backend modules themselves import
# lazily, so importing them proves nothing). openai needs only a tokenizer beside the stdlib client.
BACKEND_NEEDS = {"hf": ("torch", "transformers"), "vllm": ("vllm",), "openai": ("transformers",),
                 "fake": ()}


def probe_backends() -> dict:
    from importlib.util import find_spec

    out = {}
    for name in BACKENDS:
        needs = BACKEND_NEEDS.get(name, ())
        missing = [m for m in needs if find_spec(m) is None]
        if missing:
            hint = " (pip install 'spade[vllm]')" if name == "vllm" else ""
            out[name] = {"ok": False, "detail": f"missing: {', '.join(missing)}{hint}"}
        else:
            out[name] = {"ok": True, "detail": "installed: " + (", ".join(needs) or "nothing needed")}
    return out
