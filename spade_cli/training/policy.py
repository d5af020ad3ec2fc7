"""`spade update`'s models: the policy and the KL reference as loaded for training, their per-token
log-probs, and what the update asks of DeepSpeed.

``load`` builds a model in fp32 (the masters) with TRL's fused LM head, which returns log-probs and
entropies without ever materialising the (batch, length, vocab) logits, dropout off as TRL has it,
and, for samples drawn at several temperatures, a hook that divides each row's final hidden state by
its temperature (the same as dividing its logits, for a bias-free LM head, which is checked).
``reference`` loads the frozen KL reference whole on every process (bf16 when training in bf16;
refused under ZeRO-3).
``deepspeed_clip`` makes DeepSpeed's own clip the ``--max-grad-norm`` one.
"""

from __future__ import annotations

from typing import Any

from spade_cli.core.artifacts import SpadeError
from spade_cli.training.config import UpdateConfig


class RowTemperature:
    """Per-row temperatures for the next forward (None: the fused head's own temperature)."""

    def __init__(self) -> None:
        self.value: Any = None

    def hook(self, _module: Any, _args: Any, output: Any) -> Any:
        if self.value is not None:
            # collate shapes the temperatures (B, 1, 1) padded, (1, N, 1) packed
            output.last_hidden_state = output.last_hidden_state / self.value.to(output.last_hidden_state.dtype)
        return output


def load(path: str, temperature: float, row_temps: RowTemperature | None, device: Any = None,
          dtype: Any = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    from spade_cli.core import checkpoint

    checkpoint.check(path)
    # the fp32 masters; straight onto the GPU when given one, so no rank holds a host copy
    kw = {"device_map": {"": device}} if device is not None else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, **kw)
    add_fused_lm_head(m, temperature=temperature, outputs=("log_probs", "entropy"))
    disable_dropout_in_model(m)  # as TRL does: sampler and trainer must see one policy
    if row_temps is not None:
        head = m.get_output_embeddings()
        cfg = m.config.get_text_config()
        if getattr(head, "bias", None) is not None or getattr(cfg, "final_logit_softcapping", None):
            raise SpadeError("samples at different temperatures need a bias-free, uncapped LM head; "
                             "update each temperature separately")
        m.base_model.register_forward_hook(row_temps.hook)
    return m


def direct_device(acc: Any) -> Any:
    """The GPU to load the model onto, where the backend keeps a whole replica per rank (one
    process, DDP, ZeRO-1/2); None under ZeRO-3 and FSDP, whose loaders partition or load on rank 0
    only, and on the CPU."""
    from accelerate.utils import DistributedType

    if acc.device.type != "cuda":
        return None
    ds = acc.state.deepspeed_plugin
    if acc.distributed_type in (DistributedType.NO, DistributedType.MULTI_GPU) or (
            ds is not None and (ds.zero_stage or 0) < 3):
        return acc.device
    return None


def deepspeed_clip(config: dict, max_grad_norm: float) -> None:
    """Make DeepSpeed clip at ``--max-grad-norm``: under DeepSpeed the engine clips inside its own step
    (spade's clip call only reads the norm back), at the config's ``gradient_clipping``, which
    accelerate fills with 1.0 when left ``auto``. A config file that states another value is refused
    rather than silently overruled or obeyed."""
    clip = float(max_grad_norm or 0.0)  # DeepSpeed clips only above 0
    given = config.get("gradient_clipping", "auto")
    if given not in ("auto", None) and float(given) != clip:
        raise SpadeError(f"the DeepSpeed config sets gradient_clipping {given} but --max-grad-norm is {clip:g}; "
                         "set the config's value to auto (spade passes --max-grad-norm) or make them agree")
    config["gradient_clipping"] = clip


def check_reference_backend(zero_stage: int | None) -> None:
    """Refuse a KL reference where spade cannot load it whole: ZeRO-3's ``zero.Init`` partitions a
    model as transformers builds it, and nothing would gather the reference's parameters."""
    if (zero_stage or 0) >= 3:
        raise SpadeError("a KL term (--beta, --kl-agent, --kl-designer) is not supported under ZeRO-3: zero.Init "
                         "partitions the reference model and nothing gathers it; use recipes/accelerate/zero2.yaml "
                         "or fsdp.yaml, or train without the KL")


def reference(acc: Any, cfg: UpdateConfig, path: str, temperature: float, row_temps: RowTemperature | None) -> Any:
    """The frozen KL reference, whole on every process: in bf16 when training in bf16 (its log-probs
    are taken under bf16 autocast anyway; half the memory of fp32), straight onto the GPU where the
    backend keeps a whole replica. Under FSDP every process reads it from disk (transformers' rank-0
    loading leaves only missing keys to rank 0's broadcast); under ZeRO-3 it is refused."""
    import torch

    ds = acc.state.deepspeed_plugin
    check_reference_backend(ds.zero_stage if ds is not None else None)
    ref = load(path, temperature, row_temps, direct_device(acc), torch.bfloat16 if cfg.bf16 else None)
    return ref.eval().requires_grad_(False).to(acc.device)


def logps(model: Any, mb: dict, temps: RowTemperature | None = None) -> tuple[Any, Any]:
    """Per-token log-probs and entropies (B, C) of the completion positions, at each row's temperature,
    through TRL's fused LM head (the (B, L, vocab) logits never exist); padded or packed rows."""
    from spade_cli.training import packing

    if temps is not None:
        temps.value = mb["temperature"]
    try:
        return packing.completion_logps(model, mb)
    finally:
        if temps is not None:
            temps.value = None
