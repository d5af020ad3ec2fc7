"""Padding-free training: which models take packed micro-batches, and the forward that scores completions.

A micro-batch of rollouts is ragged: prompts of a few hundred tokens, completions from fifty to a
few thousand. Padded to the longest row, a third or more of what the model computes is padding.
Packed (``grpo.collate(..., packed=True)``), the rows are laid end to end in one row with position
ids restarting at 0 in each, and the model never sees a padding token. It is exact only where
attention stays inside each row. What transformers 5.x does with such a row (read in its source:
``masking_utils._preprocess_mask_arguments``, ``find_packed_sequence_indices`` and
``modeling_flash_attention_utils._flash_attention_forward``):

- flash attention (``flash_attention_2``/``_3``/``_4``, and hub kernels registered with its mask):
  with no attention mask, the restarts of the position ids give the varlen kernel its sequence
  boundaries, and each row attends only to itself at the cost of its own length.
- ``sdpa``, ``eager``, ``flex_attention``: ``create_causal_mask`` finds the rows from the position
  ids and builds a block-diagonal causal mask, but only when the attention mask is None and there
  is no KV cache (with ``use_cache`` on, a fresh cache skips the detection and every row attends
  to the rows before it). Exact, but the mask is (N, N) for N packed tokens and the kernel computes
  all N² scores: measured on the CPU, twice the time of the padded batch it replaces.
- an attention implementation transformers has no mask function for builds no mask at all, and
  non-attention layers (linear attention, state-space) carry their state across row boundaries:
  neither can be packed.

So an SDPA model whose layers are all full attention is switched, at its first packed batch, to
``spade_rowwise_sdpa``: transformers' own SDPA called once per row, with the causal flag and no
mask (torch's flash kernel on a GPU), and no (N, N) mask built. Padded batches still get plain SDPA.

``enabled(mode, model)`` turns the ``--packing`` setting into a layout: ``off``; ``on`` (packed,
or an error naming why the model cannot be); ``auto`` (the default: packed where that is exact and
costs no (N, N) mask, that is flash attention and SDPA without sliding windows; eager, flex and
sliding-window SDPA stay padded). ``completion_logps`` runs either layout through TRL's fused LM
head and returns (B, C) log-probs and entropies, equal in both layouts up to float rounding
(``tests/test_packing.py``).

    mb = grpo.collate(samples, samples[0], pad_id, "cpu", packed=packing.enabled("auto", model))
    logps, entropy = packing.completion_logps(model, mb)
"""

from __future__ import annotations

from typing import Any

MODES = ("auto", "on", "off")
ATTENTION_LAYERS = {"full_attention", "sliding_attention"}
ROWWISE = "spade_rowwise_sdpa"


def _config(model: Any) -> Any:
    while hasattr(model, "module"):  # DDP and DeepSpeed wrap the model; PEFT forwards .config itself
        model = model.module
    return model.config.get_text_config()


def _mask_kind(implementation: str) -> str | None:
    """How packed rows stay apart under this attention implementation: ``varlen`` (a kernel that
    takes sequence boundaries), ``rows`` (spade's row-wise SDPA), ``mask`` (an (N, N) mask), None."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if implementation in ("sdpa", ROWWISE):
        return "rows"
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        return None
    fn = ALL_MASK_ATTENTION_FUNCTIONS[implementation]
    return "varlen" if fn is ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"] else "mask"


def unsupported(model: Any) -> str | None:
    """Why packed rows would see each other in this model, or None where packing is exact."""
    cfg = _config(model)
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    if _mask_kind(impl) is None:
        return f"attention implementation {impl!r} has no transformers mask function to keep packed rows apart"
    other = sorted(set(getattr(cfg, "layer_types", None) or []) - ATTENTION_LAYERS)
    if other:
        return f"layers of type {', '.join(other)} carry state across packed rows"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope:
        return "multimodal rotary positions take 3-D position ids"
    return None


def _kind(model: Any) -> str | None:
    """``unsupported``'s verdict as a layout: None (cannot pack), ``varlen``, ``rows`` or ``mask``."""
    if unsupported(model):
        return None
    cfg = _config(model)
    kind = _mask_kind(getattr(cfg, "_attn_implementation", None) or "eager")
    # A sliding window needs the mask: row-wise SDPA calls the kernel with no mask at all.
    windowed = set(getattr(cfg, "layer_types", None) or []) - {"full_attention"}
    if kind == "rows" and (windowed or getattr(cfg, "sliding_window", None)):
        return "mask"
    return kind


def enabled(mode: str, model: Any) -> bool:
    """Whether micro-batches for ``model`` are packed under ``--packing mode``."""
    from spade_cli.core.artifacts import SpadeError

    if mode not in MODES:
        raise SpadeError(f"packing must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False
    if mode == "on" and (reason := unsupported(model)):
        raise SpadeError(f"--packing on: {reason}; use --packing auto or off")
    # An (N, N) mask is exact but costs more attention than the padding it saves: only on request.
    return mode == "on" or _kind(model) in ("varlen", "rows")


def _rowwise_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple:
    """transformers' SDPA, called once per packed row (rows start where the position ids restart
    at 0) with the causal flag and no mask: exact, each row costs its own length squared, and on a
    GPU the flash kernel inside torch's SDPA runs it. Anything else goes to plain SDPA."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    pos = kwargs.get("position_ids")
    if attention_mask is not None or pos is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    starts = torch.nonzero(pos.reshape(-1) == 0).flatten().tolist()
    bounds = [0, *[s for s in starts if s > 0], query.shape[2]]
    out = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)[0]
           for a, b in zip(bounds, bounds[1:], strict=False)]
    return torch.cat(out, dim=1), None


def _rowwise_mask(*args: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
    """SDPA's mask with padding; none for packed rows (the attention splits them), so the (N, N)
    mask is never built."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _use_rowwise(model: Any) -> None:
    """Switch an SDPA model to row-wise SDPA (for good: gradient checkpointing recomputes the
    forward later and must find the same attention). Padded batches still get plain SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    cfg = _config(model)
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or _kind(model) != "rows":
        return
    AttentionInterface.register(ROWWISE, _rowwise_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE, _rowwise_mask)
    cfg._attn_implementation = ROWWISE


def completion_logps(model: Any, mb: dict) -> tuple[Any, Any]:
    """Per-token log-probs and entropies (B, C) of the completion tokens of a ``grpo.collate``
    micro-batch, padded or packed, through TRL's fused LM head (the logits never exist)."""
    if not mb["packed"]:
        out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                    position_ids=mb["position_ids"], labels=mb["labels"], fused_lm_head=True)
        P = mb["P"]
        return out.log_probs[:, P - 1:], out.entropy[:, P - 1:] if out.entropy is not None else None
    _use_rowwise(model)
    # No attention mask and no cache: the two conditions under which transformers reads the rows
    # from the position ids (the fused head turns the cache off too; said here so it cannot drift).
    out = model(input_ids=mb["input_ids"], position_ids=mb["position_ids"], labels=mb["labels"],
                use_cache=False, fused_lm_head=True)
    return _unpack(out.log_probs, mb), _unpack(out.entropy, mb)


def _unpack(packed: Any, mb: dict) -> Any:
    """(1, N - 1) fused-head output -> (B, C), zero where a row has no completion token."""
    if packed is None:
        return None
    valid = mb["valid"]
    return packed.new_zeros(valid.shape).masked_scatter(valid, packed[0, mb["index"]])
