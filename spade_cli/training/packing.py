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
  to the rows before it). The mask is (N, N) for N packed tokens and attention costs N², so on an
  accelerator this is exact but not cheaper; on the CPU it is what the tests compare.
- an attention implementation transformers has no mask function for builds no mask at all, and
  non-attention layers (linear attention, state-space) carry their state across row boundaries:
  neither can be packed.

``enabled(mode, model)`` turns the ``--packing`` setting into a layout: ``off``; ``on`` (packed,
or an error naming why the model cannot be); ``auto`` (the default: packed where it is exact and
cheaper, that is flash attention on an accelerator and any exact implementation on the CPU).
``completion_logps`` runs either layout through TRL's fused LM head and returns (B, C) log-probs
and entropies, equal in both layouts up to float rounding (``tests/test_packing.py``).

    mb = grpo.collate(samples, samples[0], pad_id, "cpu", packed=packing.enabled("auto", model))
    logps, entropy = packing.completion_logps(model, mb)
"""

from __future__ import annotations

from typing import Any

MODES = ("auto", "on", "off")
ATTENTION_LAYERS = {"full_attention", "sliding_attention"}
FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def _config(model: Any) -> Any:
    while hasattr(model, "module"):  # DDP and DeepSpeed wrap the model; PEFT forwards .config itself
        model = model.module
    return model.config.get_text_config()


def _mask_kind(implementation: str) -> str | None:
    """The mask function transformers builds for this attention implementation (None: none)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        return None
    fn = ALL_MASK_ATTENTION_FUNCTIONS[implementation]
    return "flash" if fn is ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"] else "mask"


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


def enabled(mode: str, model: Any) -> bool:
    """Whether micro-batches for ``model`` are packed under ``--packing mode``."""
    from spade_cli.core.artifacts import SpadeError

    if mode not in MODES:
        raise SpadeError(f"packing must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False
    reason = unsupported(model)
    if mode == "on":
        if reason:
            raise SpadeError(f"--packing on: {reason}; use --packing auto or off")
        return True
    if reason:
        return False
    impl = getattr(_config(model), "_attn_implementation", None) or "eager"
    on_cpu = next(model.parameters()).device.type == "cpu"
    # Elsewhere than on the CPU, a materialised (N, N) mask costs more than the padding it saves.
    return on_cpu or _mask_kind(impl) == "flash"


def completion_logps(model: Any, mb: dict) -> tuple[Any, Any]:
    """Per-token log-probs and entropies (B, C) of the completion tokens of a ``grpo.collate``
    micro-batch, padded or packed, through TRL's fused LM head (the logits never exist)."""
    if not mb["packed"]:
        out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                    position_ids=mb["position_ids"], labels=mb["labels"], fused_lm_head=True)
        P = mb["P"]
        return out.log_probs[:, P - 1:], out.entropy[:, P - 1:] if out.entropy is not None else None
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
