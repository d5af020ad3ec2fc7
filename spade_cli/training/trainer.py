"""`spade update`'s optimizer: model, optimizer and state set-up, and one GRPO pass over the samples.

``prepare`` builds the accelerator, the fp32 model (``spade_cli.training.policy``: TRL's fused LM head,
dropout off; optional LoRA and gradient checkpointing), AdamW and the LR scheduler, the KL
reference, and resumes the trainer state of the input checkpoint when there is one
(``accelerator.load_state``: fp32 master weights, Adam moments, scheduler, RNG). ``train_pass`` then

1. recomputes the old log-probs with the trainer before the first optimizer step (as TRL does), so
   the PPO ratio starts at exactly 1 and measures only this update's own drift; each process
   computes 1/world of them and the results are gathered (``shard_old_logps``);
2. weights each sample's policy term by the truncated importance-sampling correction (TIS)
   ``exp(old - sampler)`` against the stored sampler log-probs, which corrects for what the sampler
   did differently (vLLM in bf16, top-p renormalisation, the bf16 rounding of the served weights);
3. normalises each role's loss over its own tokens or sequences in the step (``grpo.row_scales``),
   weights it by the role's share (``spade_cli.training.role_balance``), scores each sample at its own
   sampling temperature, and steps AdamW and the scheduler;
4. refuses a non-finite loss or gradient norm before it reaches the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_cli.core.artifacts import SpadeError
from spade_cli.training import policy, role_balance
from spade_cli.training.config import UpdateConfig

if TYPE_CHECKING:
    from spade_cli.training.grpo import Sample


@dataclass
class Trainer:
    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    ref: Any
    tokenizer: Any
    temps: policy.RowTemperature | None
    ref_kind: str | None  # "adapter_off" | "copy" | None
    counters: dict = field(default_factory=dict)
    snapshots: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)


def prepare(cfg: UpdateConfig, temperatures: set[float], state: dict | None, base: str, kl: bool = False) -> Trainer:
    """Everything the pass needs; ``state`` (from ``trainer_state.find``) is resumed when given;
    ``kl``: some role trains with a KL term, so the reference is loaded."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoTokenizer, get_scheduler

    from spade_cli.training import masters, trainer_state

    rss_before = masters.rss_mb()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                              mixed_precision="bf16" if cfg.bf16 else None)
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:  # no dataloader goes through prepare(), so DeepSpeed cannot infer these
        ds.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.per_device_train_batch_size
        ds.deepspeed_config["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
        policy.deepspeed_clip(ds.deepspeed_config, cfg.max_grad_norm)
    # Every generator accelerate saves with the state (python, numpy, torch), not only torch's: an
    # unseeded one starts from OS entropy, and the RNG state a pass saves would differ between two
    # identical runs (and between a preempted-and-resumed pass and an uninterrupted one).
    set_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    uniform = len(temperatures) <= 1
    head_t = next(iter(temperatures)) if uniform and temperatures else 1.0
    row_temps = None if uniform else policy.RowTemperature()
    model = policy.load(cfg.model, head_t, row_temps, policy.direct_device(accelerator))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    # The KL reference. With LoRA the frozen base is the adapter switched off: that is the input
    # model on a fresh start, and the run's base model once the adapter persists in the state.
    ref, ref_kind = None, None
    if kl:
        ref_path = base if cfg.kl_reference == "base" else cfg.model
        frozen = base if state is not None else cfg.model
        if cfg.lora and ref_path == frozen:
            ref_kind = "adapter_off"
        else:
            ref, ref_kind = policy.reference(accelerator, cfg, ref_path, head_t, row_temps), "copy"
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                            weight_decay=cfg.weight_decay)
    if cfg.lr_scheduler_type in ("linear", "cosine") and not cfg.max_steps:
        raise SpadeError(f"--lr-scheduler-type {cfg.lr_scheduler_type} needs --max-steps (the run's total)")
    sched = get_scheduler(cfg.lr_scheduler_type, opt, num_warmup_steps=cfg.warmup_steps,
                          num_training_steps=cfg.max_steps or None)
    model, opt = accelerator.prepare(model, opt)
    # Stepped by hand once per optimizer step (accelerate's wrapper would step it once per process).
    accelerator.register_for_checkpointing(sched)
    snapshots: dict = {}
    audit = cfg.weight_audit and not cfg.lora
    if audit:  # what was served before: the input checkpoint (the masters as loaded), this process's share
        snapshots["served_before"] = masters.snapshot(accelerator, model, trainer_state.serving_dtype(cfg.model))
    counters = {"updates": 0, "optimizer_steps": 0, "base_model": base}
    timings: dict = {"rss_before_load_mb": rss_before}
    if state is not None:
        from spade_cli.core import checkpoint

        for weights in sorted(Path(state["path"]).glob("*.safetensors")):  # the masters, when not sharded
            checkpoint.safetensors_header(weights)
        t0 = time.perf_counter()
        accelerator.load_state(state["path"])
        timings["state_load_s"] = round(time.perf_counter() - t0, 3)
        counters.update(updates=state.get("updates", 0), optimizer_steps=state.get("optimizer_steps", 0))
        if audit:  # the real fp32 masters (the optimizer's, under DeepSpeed), this process's share
            snapshots["master_before"] = masters.snapshot(accelerator, model)
    return Trainer(accelerator, model, opt, sched, ref, tokenizer, row_temps, ref_kind, counters, snapshots, timings)


def shard_old_logps(tr: Trainer, samples: list[Sample], bs: int, pad_id: int, packed: bool = False) -> int:
    """Set every sample's ``old_logps``, each process computing 1/world of them: the micro-batches of
    ``bs`` consecutive samples are dealt round-robin, so each is the batch one process would run
    (the same log-probs), and the results are gathered onto every process, whose steps need any
    sample's. Every process runs the same number of forwards (a process short of one repeats its
    first batch and drops the result): FSDP, ZeRO-3 and DDP's buffer sync make a forward collective.
    Returns the forwards this process ran."""
    import torch

    from spade_cli.training import grpo

    acc = tr.accelerator
    world, rank = acc.num_processes, acc.process_index
    chunks = [samples[i:i + bs] for i in range(0, len(samples), bs)]
    mine = list(range(rank, len(chunks), world))
    rounds = -(-len(chunks) // world)
    done: list[tuple[int, list[list[float]]]] = []
    with torch.no_grad():
        for k in range(rounds):
            c = mine[k] if k < len(mine) else (mine[0] if mine else 0)
            mb = grpo.collate(chunks[c], chunks[c][0], pad_id, acc.device, packed)
            with acc.autocast():
                lp, _ = policy.logps(tr.model, mb, tr.temps)
            if k >= len(mine):
                continue
            rows = lp.float().tolist()
            done.append((c, [[v if m else 0.0 for v, m in zip(row[:len(s.mask)], s.mask, strict=True)]
                             for row, s in zip(rows, chunks[c], strict=False)]))
    if world > 1:
        from accelerate.utils import gather_object

        done = gather_object(done)
    for c, lps in done:
        for s, lp in zip(chunks[c], lps, strict=True):
            s.old_logps = lp
    return rounds


def fill_old_logps(tr: Trainer, cfg: UpdateConfig, samples: list[Sample], pad_id: int) -> dict:
    """pi_old from the trainer before the first step, for every sample; returns the statistics of
    the sampler correction these old log-probs imply (what ``update.json`` reports under ``sampler``)."""
    import torch

    from spade_cli.training import grpo, packing

    bs = cfg.per_device_train_batch_size
    shard_old_logps(tr, samples, bs, pad_id, packing.enabled(cfg.packing, tr.model))
    diffs, weights, raws = [], [], []
    with torch.no_grad():
        for i in range(0, len(samples), bs):
            chunk = samples[i:i + bs]
            mb = grpo.collate(chunk, chunk[0], pad_id, "cpu")
            live = torch.tensor([s.sampler_logps is not None for s in chunk])
            mask = mb["mask"] * live[:, None]
            if cfg.tis and bool(live.any()):
                w, raw = grpo.sampler_correction(mb["old"], mb["sampler"], mask, cfg.tis_mode, cfg.tis_cap,
                                                 cfg.tis_min)
                sel = (mask > 0) if w.shape == mask.shape else live[:, None]
                weights.append(w[sel])
                raws.append(raw[sel])
            diffs.append((mb["old"] - mb["sampler"]).abs()[mask > 0])
    with_lp = sum(s.sampler_logps is not None for s in samples)
    stats: dict = {"enabled": cfg.tis, "mode": cfg.tis_mode, "cap": cfg.tis_cap,
                   "cap_min": cfg.tis_min, "rows_with_sampler_logprobs": with_lp,
                   "rows_without_sampler_logprobs": len(samples) - with_lp}
    d = torch.cat(diffs) if diffs else torch.zeros(0)
    stats["logp_diff_abs"] = {"mean": float(d.mean()), "max": float(d.max())} if d.numel() else None
    if weights:
        w, raw = torch.cat(weights), torch.cat(raws)
        lo = -float("inf") if cfg.tis_min is None else cfg.tis_min
        hi = float("inf") if cfg.tis_cap is None else cfg.tis_cap
        stats["weight"] = grpo.describe(w)
        stats["raw_ratio"] = grpo.describe(raw)
        stats["outside_cap_fraction"] = float(((raw < lo) | (raw > hi)).float().mean())
    return stats


def _refuse_nonfinite(acc: Any, value: Any, what: str) -> None:
    """Abort the update, before the backward that would spread it into every weight, when ``value``
    is NaN or infinite on any process (every process raises at the same call: no collective hangs)."""
    import torch

    bad = (~torch.isfinite(value.detach())).any().float().reshape(1)
    if acc.num_processes > 1:
        bad = acc.reduce(bad, reduction="sum")
    if bool(bad.item() > 0):
        raise SpadeError(f"{what} is not finite (NaN or infinite): the model or its inputs carry a non-finite "
                         "value; nothing was published")


def _stop_requested(acc: Any) -> bool:
    """Whether any process got a SIGTERM: every process must stop at the same step."""
    import torch

    from spade_cli.core import preempt

    flag = torch.tensor([1.0 if preempt.requested() else 0.0], device=acc.device)
    if acc.num_processes > 1:
        flag = acc.reduce(flag, reduction="sum")
    return bool(flag.item() > 0)


def train_pass(tr: Trainer, cfg: UpdateConfig, samples: list[Sample], log: Callable[[str], None],
               partial: Path | None = None, resumed: dict | None = None) -> dict:
    """Old log-probs, then ``num_iterations`` passes of optimizer steps; returns metrics and roles.

    With ``partial``, a SIGTERM (``preempt.deferred`` around the call) stops the pass before the
    next optimizer step: the state and the progress go to ``partial`` and ``Preempted`` is raised.
    ``resumed`` is that progress (from ``trainer_state.load_partial``): the pass continues after it."""
    import torch

    from spade_cli.core import preempt
    from spade_cli.training import grpo, packing, trainer_state

    acc, model, opt = tr.accelerator, tr.model, tr.optimizer
    pad_id = tr.tokenizer.pad_token_id if tr.tokenizer.pad_token_id is not None else 0
    packed = packing.enabled(cfg.packing, model)
    world, ga = acc.num_processes, cfg.gradient_accumulation_steps
    keys = ("loss", "kl", "entropy", "clip_low", "clip_high", "clip_region", "tokens", "seq_tokens", "kl_designer",
            "tokens_designer")
    if resumed is None:
        t_old = time.time()
        sampler_stats = fill_old_logps(tr, cfg, samples, pad_id)
        old_seconds = time.time() - t_old
        start, sums, grad_norms, before = 0, torch.zeros(len(keys), dtype=torch.float64), [], 0.0
    else:  # pi_old is the model before the first step, which only the partial remembers
        for s, lp in zip(samples, resumed["old_logps"], strict=True):
            s.old_logps = lp
        sampler_stats, old_seconds = resumed["sampler"], resumed["old_logps_seconds"]
        start, grad_norms, before = resumed["step"], list(resumed["grad_norms"]), resumed["train_seconds"]
        sums = torch.tensor(resumed["sums"], dtype=torch.float64)
        tr.counters["optimizer_steps"] = resumed["optimizer_steps"]
    mcl = cfg.dr_grpo_length or max(len(s.completion_ids) for s in samples)
    roles = [s.role for s in samples]
    plan = role_balance.plan(roles, cfg.per_device_train_batch_size, ga, world, cfg.num_iterations, cfg.seed)
    balance = role_balance.step_weights(plan, roles, role_balance.resolve_shares(cfg, set(roles)))
    weight = {r: b["step_weight"] for r, b in balance.items()}
    beta, kl_on = role_balance.betas(cfg), tr.ref_kind is not None
    t0 = time.time()
    for step, ranks in enumerate(plan):
        if step < start:
            continue
        if partial is not None and _stop_requested(acc):
            if step > start:  # else nothing new since the partial (or the input) to keep
                trainer_state.save_partial(acc, partial, {
                    "step": step, "optimizer_steps": tr.counters["optimizer_steps"], "sums": sums.tolist(),
                    "grad_norms": grad_norms, "old_logps": [s.old_logps for s in samples],
                    "sampler": sampler_stats, "old_logps_seconds": old_seconds,
                    "train_seconds": before + time.time() - t0})
            raise preempt.Preempted(f"SIGTERM: stopped before optimizer step {step + 1}/{len(plan)}; the "
                                    f"state after step {step} is kept in {partial}, rerun to resume")
        # The per-role normalisers of this step, over every process's micro-batches (same on all).
        rows = [(i, (r, k)) for r, mbs in enumerate(ranks) for k, mbatch in enumerate(mbs) for i in mbatch
                if i is not None]
        scales = dict(zip([i for i, _ in rows], grpo.row_scales(
            cfg.loss_type, [samples[i].role for i, _ in rows], [sum(samples[i].mask) for i, _ in rows],
            [mb for _, mb in rows], mcl), strict=True))
        fallback = samples[rows[0][0]]
        for mbatch in ranks[acc.process_index]:
            with acc.accumulate(model):
                mb = grpo.collate([None if i is None else samples[i] for i in mbatch], fallback, pad_id, acc.device,
                                  packed)
                w = torch.tensor([0.0 if i is None else weight[samples[i].role] for i in mbatch], device=acc.device)
                b = torch.tensor([0.0 if i is None else beta[samples[i].role] for i in mbatch], device=acc.device)
                designer = torch.tensor([i is not None and samples[i].role == "designer" for i in mbatch],
                                        device=acc.device)
                c = torch.tensor([0.0 if i is None else scales[i] for i in mbatch], device=acc.device)
                mask = mb["mask"]
                is_w = None
                if cfg.tis:
                    is_w, _ = grpo.sampler_correction(mb["old"], mb["sampler"], mask, cfg.tis_mode, cfg.tis_cap,
                                                      cfg.tis_min)
                with acc.autocast():
                    lp, ent = policy.logps(model, mb, tr.temps)
                    ref_lp = None
                    if kl_on:
                        with torch.no_grad():
                            if tr.ref is not None:
                                ref_lp, _ = policy.logps(tr.ref, mb, tr.temps)
                            else:
                                with acc.unwrap_model(model).disable_adapter():
                                    ref_lp, _ = policy.logps(model, mb, tr.temps)
                lp = lp.float()
                ptl, coef_1, kl = grpo.per_token_loss(
                    lp, mb["old"], mb["adv"], mask, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
                    delta=cfg.delta, importance_sampling_level=cfg.importance_sampling_level, beta=b if kl_on else 0.0,
                    ref_logps=None if ref_lp is None else ref_lp.float(),
                    use_bias_correction_kl=cfg.use_bias_correction_kl, weights=w, is_ratio=is_w)
                loss = ((ptl * mask).sum(-1) * c).sum()
                _refuse_nonfinite(acc, loss, f"the loss at optimizer step {step + 1}/{len(plan)}")
                # accelerate divides by the accumulation steps and DDP averages over processes;
                # the step's loss is the plain sum of its micro-batch terms, so undo both.
                acc.backward(loss * ga * world)
                if acc.sync_gradients and cfg.max_grad_norm and cfg.max_grad_norm > 0:
                    norm = acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    if norm is not None:  # the same on every process (the norm of the reduced gradient)
                        grad_norms.append(float(norm))
                        if not math.isfinite(grad_norms[-1]):
                            raise SpadeError(f"the gradient norm at optimizer step {step + 1}/{len(plan)} is "
                                             f"{grad_norms[-1]!r}; nothing was published")
                opt.step()
                if acc.sync_gradients:
                    tr.scheduler.step()
                    tr.counters["optimizer_steps"] += 1
                opt.zero_grad()
            with torch.no_grad():
                clips = grpo.clip_fractions(coef_1, mb["adv"], mask, epsilon=cfg.epsilon,
                                            epsilon_high=cfg.epsilon_high)
                vals = [float(loss), float((kl * mask).sum()) if kl is not None else 0.0,
                        float((ent.float() * mask).sum()) if ent is not None else 0.0, float(clips["clip_low"]),
                        float(clips["clip_high"]), float(clips["clip_region"]), float(mask.sum()),
                        float(mb["attention_mask"][mb["real"] > 0].sum()),
                        float((kl * mask)[designer].sum()) if kl is not None else 0.0, float(mask[designer].sum())]
                sums += torch.tensor(vals, dtype=torch.float64)
        log(f"step {step + 1}/{len(plan)}: grad norm {grad_norms[-1] if grad_norms else float('nan'):.4g}")
    seconds = before + time.time() - t0
    tr.counters["updates"] += 1
    totals = dict(zip(keys, acc.reduce(sums.to(acc.device), reduction="sum").tolist(), strict=True))
    attended = int(totals.pop("seq_tokens"))
    tokens = max(totals["tokens"], 1.0)
    metrics = {
        "loss": totals["loss"] / max(len(plan), 1),
        "kl": totals["kl"] / tokens if kl_on else None,
        "entropy": totals["entropy"] / tokens,
        "clip_ratio": {k.split("_")[1]: totals[k] / tokens for k in ("clip_low", "clip_high", "clip_region")},
        "grad_norm": {"mean": sum(grad_norms) / len(grad_norms), "max": max(grad_norms)} if grad_norms else None,
        "optimizer_steps": len(plan), "old_logps_recomputed": len(samples), "max_completion_length": mcl,
        "learning_rate": tr.scheduler.get_last_lr()[0], "old_logps_seconds": round(old_seconds, 3),
        "train_seconds": round(seconds, 3), "processes": world, "packed": packed,
        "tokens_per_s": round(attended / seconds, 1) if seconds > 0 else None,
    }
    roles = {}
    role_kl = {"designer": (totals["kl_designer"], totals["tokens_designer"]),
               "agent": (totals["kl"] - totals["kl_designer"], totals["tokens"] - totals["tokens_designer"])}
    for role in ("agent", "designer"):
        mine = [s for s in samples if s.role == role]
        roles[role] = {
            **balance[role], "beta": beta[role],
            "kl": role_kl[role][0] / max(role_kl[role][1], 1.0) if kl_on and mine else None,
            "advantage": grpo.describe(torch.tensor([s.advantage for s in mine])),
            "reward": grpo.describe(torch.tensor([s.reward for s in mine])),
            "temperature": sorted({s.temperature for s in mine}),
            "tokens": {"prompt": sum(len(s.prompt_ids) for s in mine), "trained": sum(sum(s.mask) for s in mine),
                       "env_masked": sum(len(s.mask) - sum(s.mask) for s in mine)},
        }
    return {"metrics": metrics, "roles": roles, "sampler": sampler_stats}
