"""The fp32 master weights one parameter at a time under any backend, and the audit computed per shard.

Under DeepSpeed the module holds bf16 copies and the fp32 masters live in the optimizer's flat
partitions (ZeRO-1/2/3); under ZeRO-3 the module's own parameters are empty (shape [0]) on every
process; under FSDP2 each parameter is a DTensor of which a process holds one shard. ``full`` hides
that: it yields every trainable parameter's full fp32 master on every process, one at a time
(collective: all processes iterate in step), so no process ever holds a full copy of the model
beyond the one parameter in flight.

The audit of what the served checkpoint kept of an update (``trainer_state.audit``) is a set of
element-wise sums. Each process keeps its snapshots only for the parameters it owns (index modulo
the process count) and adds up its own sums; the sums of all processes are reduced into the
figures. The snapshots therefore cost 6 bytes per parameter per node (2 served + 4 master), divided
by the node count, however many processes a node runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

SUMS = ("changed", "elements", "update_sq", "served_update_sq", "lost_sq", "residual_sq")


def full(acc: Any, model: Any) -> Iterator[tuple[str, Any]]:
    """(name, full fp32 master on the CPU) for every trainable parameter, on every process."""
    import torch

    ds = getattr(acc.state, "deepspeed_plugin", None) is not None
    if ds:
        from deepspeed.utils import safe_get_full_fp32_param
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no FSDP2 either
        DTensor = ()  # noqa: N806
    for name, p in acc.unwrap_model(model).named_parameters():
        if not p.requires_grad:
            continue
        if ds:
            t = safe_get_full_fp32_param(p)  # gathers the optimizer's fp32 partitions (collective)
            if t is None:  # no ZeRO optimizer and no bf16 one: the fp32 module is the master
                t = p.detach()
        elif isinstance(p, DTensor):
            t = p.full_tensor()  # FSDP2: all-gather of the sharded fp32 parameter (collective)
        else:
            t = p.detach()
        yield name, t.to("cpu", torch.float32, copy=True)


def owns(acc: Any, index: int) -> bool:
    return index % acc.num_processes == acc.process_index


def snapshot(acc: Any, model: Any, dtype: Any = None) -> dict:
    """This process's share of the masters (cast to ``dtype`` when given). Collective."""
    return {name: (t.to(dtype) if dtype is not None else t)
            for i, (name, t) in enumerate(full(acc, model)) if owns(acc, i)}


def sums(served_before: dict, master_before: dict | None, master_after: dict, served_after: dict) -> list[float]:
    """The audit's sums over the tensors (or flat slices of tensors) this process holds.

    A key missing from a snapshot, or a tensor with no elements (a partition another process
    holds: ZeRO-3 leaves shape-[0] parameters behind), adds nothing, so adding the sums of every
    shard gives the sums of the whole model. Shards of one key must cover the same elements in all
    four snapshots."""
    import torch

    out = [0.0] * len(SUMS)
    for k, s_after in served_after.items():
        if not s_after.is_floating_point() or k not in served_before or k not in master_after:
            continue
        if master_before is not None and k not in master_before:
            continue
        parts = [served_before[k], s_after, master_after[k]] + ([master_before[k]] if master_before is not None else [])
        if any(t.numel() == 0 for t in parts):
            continue
        if len({t.numel() for t in parts}) != 1:
            raise ValueError(f"audit: the snapshots of {k} hold different elements "
                             f"({[tuple(t.shape) for t in parts]})")
        s_b, s_a = served_before[k].reshape(-1).float(), s_after.reshape(-1).float()
        m_a = master_after[k].reshape(-1).float()
        m_b = master_before[k].reshape(-1).float() if master_before is not None else s_b
        d_master, d_served = (m_a - m_b).double(), (s_a - s_b).double()
        vals = [int((served_before[k].reshape(-1) != s_after.reshape(-1)).sum()), s_after.numel(),
                float(torch.sum(d_master ** 2)), float(torch.sum(d_served ** 2)),
                float(torch.sum((d_served - d_master) ** 2)), float(torch.sum((m_a - s_a).double() ** 2))]
        out = [a + b for a, b in zip(out, vals, strict=True)]
    return out


def figures(total: list[float]) -> dict:
    """The audit's figures from the (reduced) sums; see ``trainer_state.audit``."""
    s = dict(zip(SUMS, total, strict=True))
    upd_l2 = math.sqrt(s["update_sq"])
    elements = int(s["elements"])
    return {"changed_fraction": s["changed"] / elements if elements else 0.0, "elements": elements,
            "master_update_l2": upd_l2, "served_update_l2": math.sqrt(s["served_update_sq"]),
            "rounding_lost_fraction": math.sqrt(s["lost_sq"]) / upd_l2 if upd_l2 > 0 else None,
            "residual_l2": math.sqrt(s["residual_sq"])}


def reduce(acc: Any, local: list[float]) -> list[float]:
    """The sums of every process (float64, so element counts stay exact). Collective."""
    import torch

    if acc.num_processes == 1:
        return local
    t = torch.tensor(local, dtype=torch.float64, device=acc.device)
    return acc.reduce(t, reduction="sum").tolist()


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux; 0 elsewhere)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


def host_memory(acc: Any, before_load_mb: float, snapshots: dict) -> dict:
    """Every process's resident memory before the model was loaded and at its peak, and the audit
    snapshots it held (MB); the total the update added over all processes. Collective."""
    import resource

    import torch
    from accelerate.utils import gather_object

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux
    held = sum(t.numel() * t.element_size() for snap in snapshots.values() for t in snap.values()) / 1e6
    mine = [{"process": acc.process_index, "before_load_mb": round(before_load_mb, 1), "peak_mb": round(peak, 1),
             "snapshots_mb": round(held, 3)}]
    if torch.cuda.is_available():
        mine[0]["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1)
    every = gather_object(mine) if acc.num_processes > 1 else mine
    return {"per_process": every, "added_mb": round(sum(p["peak_mb"] - p["before_load_mb"] for p in every), 1)}
