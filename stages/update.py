"""`spade update`: one GRPO step on both roles from stored artifacts, written as a new checkpoint.

Inputs are the files the earlier stages wrote: episodes (``spade.rollout/1``: prompt ids,
completion ids with the environment's observations spliced in, ``env_mask``, sampler log-probs,
``return``), designs (``spade.validation/1`` or ``spade.design/1``: the Designer prompt and
completion ids, ``group_id``) and scores (``spade.score/1``: ``designer_reward`` per ``env_id``).

Samples and groups:

- Agent: one sample per episode, grouped by ``(env_id, hinted)``, reward = ``return``. Only
  unhinted episodes by default (``agent_episodes``); with ``both`` the hinted episodes form their
  own groups, because the hint shifts every return and a shared baseline would reward "having
  the hint" instead of the actions. Environment tokens (``env_mask`` 0) are scored by nobody.
  Episodes with an ``error`` are left out: every reason code is an environment or sandbox failure
  (DESIGN §5), and punishing the actions that happened to hit a bug teaches nothing.
- Designer: one sample per design with tokens, grouped by ``group_id`` (designs sampled from
  one prompt), reward = the ``designer_reward`` of its ``env_id``. Invalid designs
  (``valid`` false or no code) get ``invalid_reward``; valid designs without a score row (never
  rolled out) are left out rather than guessed.
- Groups with zero reward spread are dropped; the rest get ``grpo.group_advantages``.

The loop is spade's own, not ``GRPOTrainer``: TRL has no offline mode, the two roles have
different masks and groupings in one batch, and the importance ratio must use the stored sampler
log-probs. The loss is TRL's, term by term (``spade_cli.grpo``), log-probs come from TRL's fused
LM head (no full-vocabulary logits) at the sampling temperature, and device placement, gradient
accumulation, DeepSpeed and FSDP come from accelerate, so ``accelerate launch`` works unchanged.

The output directory is built under a temporary name and renamed into place, so a killed run never
leaves a half checkpoint; a rerun starts the update over (it is one short optimizer pass).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_cli.artifacts import InputError, SpadeError, Stage, atomic_write_text, expand_inputs, read_rows
from spade_cli.records import Design, Rollout, Score

if TYPE_CHECKING:  # spade_cli.grpo imports torch: only inside functions here
    from spade_cli.grpo import Sample


@dataclass
class UpdateConfig:
    """The knobs, named as in TRL's GRPOConfig where one exists."""

    model: str
    designs: list[str] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    scores: list[str] = field(default_factory=list)
    out: str = "ckpt"
    agent_episodes: str = "unhinted"  # unhinted | hinted | both
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    importance_sampling: bool = True
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    temperature: float = 1.0
    agent_weight: float = 1.0
    designer_weight: float = 1.0
    invalid_reward: float = -1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    max_completion_length: int | None = None
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    bf16: bool = False
    gradient_checkpointing: bool = False
    seed: int = 0


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _tokens(path: Path, line: int, tokens: dict, need_env_mask: bool) -> tuple[list, list, list, list | None]:
    """Checked (prompt_ids, completion_ids, mask, logprobs) of a row; a malformed field names the row."""
    p, c = tokens.get("prompt_ids"), tokens.get("completion_ids")
    if not _ids(p) or not _ids(c) or not c:
        raise InputError(path, line, "tokens.prompt_ids/completion_ids must be non-empty lists of ints")
    mask = tokens.get("env_mask") if need_env_mask else [1] * len(c)
    if not isinstance(mask, list) or len(mask) != len(c) or any(m not in (0, 1) for m in mask):
        raise InputError(path, line, "tokens.env_mask must be a list of 0/1 as long as completion_ids")
    lps = tokens.get("logprobs")
    if lps is not None:
        if not isinstance(lps, list) or len(lps) != len(c):
            raise InputError(path, line, "tokens.logprobs must be as long as completion_ids")
        for m, lp in zip(mask, lps, strict=True):
            if m and not (isinstance(lp, int | float) and math.isfinite(lp)):
                raise InputError(path, line, "tokens.logprobs must be finite numbers at agent tokens")
        lps = [float(lp) if m else 0.0 for m, lp in zip(mask, lps, strict=True)]
    return p, c, mask, lps


def collect_samples(cfg: UpdateConfig) -> tuple[list[Sample], dict]:
    """Read the artifacts into samples with advantages; returns (kept samples, per-role counts)."""
    import torch

    from spade_cli import grpo
    from spade_cli.grpo import Sample

    counts: dict[str, dict[str, int]] = {"agent": {}, "designer": {}}

    def bump(role: str, key: str) -> None:
        counts[role][key] = counts[role].get(key, 0) + 1

    # A score row names its design by (group_id, sample) when regret copied them (one row per
    # design, invalid ones included); env_id alone is ambiguous for parse failures and duplicates.
    rewards: dict[str, float] = {}
    slot_rewards: dict[tuple, float] = {}
    for _path, _line, rec in read_rows(cfg.scores, "spade.score"):
        assert isinstance(rec, Score)
        rewards.setdefault(rec.env_id, float(rec.designer_reward))
        if rec.extra.get("group_id") is not None:
            slot_rewards[(rec.extra["group_id"], rec.extra.get("sample"))] = float(rec.designer_reward)

    samples: list[Sample] = []
    want = {"unhinted": (False,), "hinted": (True,), "both": (False, True)}[cfg.agent_episodes]
    for path, line, rec in read_rows(cfg.rollouts, "spade.rollout") if cfg.rollouts else []:
        assert isinstance(rec, Rollout)
        if rec.hinted not in want:
            continue
        bump("agent", "episodes")
        if rec.error is not None:
            bump("agent", "skipped_error")
            continue
        if not rec.tokens:
            bump("agent", "skipped_no_tokens")
            continue
        p, c, mask, lps = _tokens(path, line, rec.tokens, need_env_mask=True)
        samples.append(Sample("agent", ("agent", rec.env_id, rec.hinted), float(rec.return_), p, c, mask, lps))

    for path, line, rec in read_rows(cfg.designs, ("spade.validation", "spade.design")) if cfg.designs else []:
        assert isinstance(rec, Design)
        bump("designer", "designs")
        if not rec.tokens:
            bump("designer", "skipped_no_tokens")
            continue
        invalid = rec.code is None or getattr(rec, "valid", True) is False
        if invalid:
            bump("designer", "invalid")
        slot = (rec.group_id, rec.sample)
        if slot in slot_rewards:
            reward = slot_rewards[slot]
        elif invalid:
            reward = cfg.invalid_reward
        elif rec.env_id in rewards:
            reward = rewards[rec.env_id]
        else:
            bump("designer", "skipped_unscored")
            continue
        p, c, mask, lps = _tokens(path, line, rec.tokens, need_env_mask=False)
        group = ("designer", rec.group_id if rec.group_id is not None else f"{path}:{line}")
        samples.append(Sample("designer", group, reward, p, c, mask, lps))

    kept: list[Sample] = []
    for role in ("agent", "designer"):
        mine = [s for s in samples if s.role == role]
        if not mine:
            continue
        adv, keep = grpo.group_advantages(torch.tensor([s.reward for s in mine]), [s.group for s in mine],
                                          cfg.scale_rewards)
        groups = {s.group for s in mine}
        live = {s.group for s, k in zip(mine, keep.tolist(), strict=True) if k}
        counts[role].update(samples=len(mine), groups=len(groups), zero_spread_groups=len(groups - live))
        for s, a, k in zip(mine, adv.tolist(), keep.tolist(), strict=True):
            if k:
                s.advantage = a
                kept.append(s)
    return kept, counts


def _logps(model: Any, mb: dict) -> tuple[Any, Any]:
    """Per-token log-probs and entropies of the completion positions, at the training temperature,
    through TRL's fused LM head (the (B, L, vocab) logits never exist)."""
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
                labels=mb["labels"], fused_lm_head=True)
    P = mb["P"]
    return out.log_probs[:, P - 1:], out.entropy[:, P - 1:] if out.entropy is not None else None


def _prepare(cfg: UpdateConfig) -> tuple[Any, Any, Any, Any, Any]:
    """Accelerator, model (fused head, optional LoRA/checkpointing), optimizer, reference, tokenizer."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    accelerator = Accelerator(gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                              mixed_precision="bf16" if cfg.bf16 else None)
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:  # no dataloader goes through prepare(), so DeepSpeed cannot infer these
        ds.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.per_device_train_batch_size
        ds.deepspeed_config["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)

    def load() -> Any:
        m = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
        add_fused_lm_head(m, temperature=cfg.temperature, outputs=("log_probs", "entropy"))
        disable_dropout_in_model(m)  # as TRL does: sampler and trainer must see one policy
        return m

    model = load()
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    ref = None
    if cfg.beta != 0.0 and not cfg.lora:  # with LoRA the reference is the base with the adapter off
        ref = load().eval().requires_grad_(False).to(accelerator.device)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                            weight_decay=cfg.weight_decay)
    model, opt = accelerator.prepare(model, opt)
    return accelerator, model, opt, ref, tokenizer


def _fill_old_logps(cfg: UpdateConfig, accelerator: Any, model: Any, samples: list[Sample], pad_id: int) -> int:
    """π_old from the current weights for samples without usable sampler log-probs (or all of them
    with ``importance_sampling`` off): the ratio then starts at 1, as in TRL without vLLM."""
    import torch

    from spade_cli import grpo

    todo = [s for s in samples if s.old_logps is None or not cfg.importance_sampling]
    bs = cfg.per_device_train_batch_size
    with torch.no_grad():
        for i in range(0, len(todo), bs):
            chunk = todo[i:i + bs]
            mb = grpo.collate(chunk, chunk[0], pad_id, accelerator.device)
            with accelerator.autocast():
                lp, _ = _logps(model, mb)
            for j, s in enumerate(chunk):
                s.old_logps = [v if m else 0.0 for v, m in zip(lp[j, :len(s.mask)].float().tolist(), s.mask,
                                                               strict=True)]
    return len(todo)


def train(cfg: UpdateConfig, samples: list[Sample], log: Callable[[str], None]) -> dict:
    """The optimizer loop; returns metrics plus what ``save`` needs (accelerator, model)."""
    import torch

    from spade_cli import grpo

    accelerator, model, opt, ref, tokenizer = _prepare(cfg)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    world, ga = accelerator.num_processes, cfg.gradient_accumulation_steps
    recomputed = _fill_old_logps(cfg, accelerator, model, samples, pad_id)
    mcl = cfg.max_completion_length or max(len(s.completion_ids) for s in samples)
    weight = {"agent": cfg.agent_weight, "designer": cfg.designer_weight}
    plan = grpo.plan_steps(len(samples), cfg.per_device_train_batch_size, ga, world, cfg.num_iterations, cfg.seed)
    keys = ("loss", "kl", "entropy", "clip_low", "clip_high", "clip_region", "tokens", "seq_tokens")
    sums = torch.zeros(len(keys), dtype=torch.float64)
    grad_norms: list[float] = []
    attended = 0
    t0 = time.time()
    for step, ranks in enumerate(plan):
        real = [[i for mbatch in r for i in mbatch if i is not None] for r in ranks]
        n_items = sum(sum(samples[i].mask) for r in real for i in r)
        n_real_mb = sum(1 for r in ranks for mbatch in r if mbatch != [None])
        factor = ga * world if cfg.loss_type == "dapo" else ga * world / max(n_real_mb, 1)
        for mbatch in ranks[accelerator.process_index]:
            with accelerator.accumulate(model):
                mb = grpo.collate([None if i is None else samples[i] for i in mbatch], samples[real[0][0]],
                              pad_id, accelerator.device)
                w = torch.tensor([0.0 if i is None else weight[samples[i].role] for i in mbatch],
                                 device=accelerator.device)
                with accelerator.autocast():
                    logps, ent = _logps(model, mb)
                    ref_lp = None
                    if cfg.beta != 0.0:
                        with torch.no_grad():
                            if ref is not None:
                                ref_lp, _ = _logps(ref, mb)
                            else:
                                with accelerator.unwrap_model(model).disable_adapter():
                                    ref_lp, _ = _logps(model, mb)
                logps = logps.float()
                mask = mb["mask"]
                ptl, coef_1, kl = grpo.per_token_loss(
                    logps, mb["old"], mb["adv"], mask, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
                    delta=cfg.delta, importance_sampling_level=cfg.importance_sampling_level, beta=cfg.beta,
                    ref_logps=None if ref_lp is None else ref_lp.float(),
                    use_bias_correction_kl=cfg.use_bias_correction_kl, weights=w)
                loss = grpo.aggregate(ptl, mask, cfg.loss_type, max_completion_length=mcl, num_items=n_items)
                accelerator.backward(loss * factor)
                if accelerator.sync_gradients and cfg.max_grad_norm and cfg.max_grad_norm > 0:
                    norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    if norm is not None:
                        grad_norms.append(float(norm))
                opt.step()
                opt.zero_grad()
            with torch.no_grad():
                clips = grpo.clip_fractions(coef_1, mb["adv"], mask, epsilon=cfg.epsilon,
                                            epsilon_high=cfg.epsilon_high)
                vals = [float(loss) * factor / (ga * world), float((kl * mask).sum()) if kl is not None else 0.0,
                        float((ent.float() * mask).sum()) if ent is not None else 0.0, float(clips["clip_low"]),
                        float(clips["clip_high"]), float(clips["clip_region"]), float(mask.sum()),
                        float(mb["attention_mask"][mb["real"] > 0].sum())]
                sums += torch.tensor(vals, dtype=torch.float64)
        log(f"step {step + 1}/{len(plan)}: grad norm {grad_norms[-1] if grad_norms else float('nan'):.4g}")
    seconds = time.time() - t0
    totals = dict(zip(keys, accelerator.reduce(sums.to(accelerator.device), reduction="sum").tolist(),
                      strict=True))
    attended = int(totals.pop("seq_tokens"))
    tokens = max(totals["tokens"], 1.0)
    metrics = {
        "loss": totals["loss"] / max(len(plan), 1),
        "kl": totals["kl"] / tokens if cfg.beta != 0.0 else None,
        "entropy": totals["entropy"] / tokens,
        "clip_ratio": {k.split("_")[1]: totals[k] / tokens for k in ("clip_low", "clip_high", "clip_region")},
        "grad_norm": {"mean": sum(grad_norms) / len(grad_norms), "max": max(grad_norms)} if grad_norms else None,
        "optimizer_steps": len(plan), "old_logps_recomputed": recomputed, "max_completion_length": mcl,
        "train_seconds": round(seconds, 3), "processes": world,
        "tokens_per_s": round(attended / seconds, 1) if seconds > 0 else None,
    }
    roles = {}
    for role in ("agent", "designer"):
        mine = [s for s in samples if s.role == role]
        roles[role] = {
            "advantage": grpo.describe(torch.tensor([s.advantage for s in mine])),
            "reward": grpo.describe(torch.tensor([s.reward for s in mine])),
            "tokens": {"prompt": sum(len(s.prompt_ids) for s in mine), "trained": sum(sum(s.mask) for s in mine),
                       "env_masked": sum(len(s.mask) - sum(s.mask) for s in mine)},
        }
    return {"metrics": metrics, "roles": roles, "accelerator": accelerator, "model": model,
            "tokenizer": tokenizer}


def save(cfg: UpdateConfig, trained: dict, tmp: Path) -> None:
    """Write a plain HF checkpoint (model in the input's dtype, tokenizer, chat template) to ``tmp``.
    Every process calls this (ZeRO-3 and FSDP gather the weights collectively); the main one writes."""
    import torch
    from transformers import AutoConfig

    accelerator, model = trained["accelerator"], trained["model"]
    state_dict = None if cfg.lora else accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return
    dtype = getattr(AutoConfig.from_pretrained(cfg.model), "dtype", None)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    unwrapped = accelerator.unwrap_model(model)
    if cfg.lora:  # merged, so vLLM, lm-eval and the next rollout load it without peft
        unwrapped = unwrapped.merge_and_unload()
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        if state_dict is not None:
            state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
        else:
            unwrapped = unwrapped.to(dtype)
    shutil.rmtree(tmp, ignore_errors=True)
    unwrapped.save_pretrained(tmp, state_dict=state_dict)
    trained["tokenizer"].save_pretrained(tmp)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # checkpoints are large and never modified in place: share the blocks
    except OSError:
        shutil.copy2(src, dst)


def _pass_through(cfg: UpdateConfig, stage: Stage, counts: dict, log: Callable[[str], None], t0: float) -> dict:
    """No sample carries a learning signal: publish the input model unchanged as the new checkpoint,
    with an ``update.json`` that says why, so the next iteration starts from it."""
    import json

    out = Path(cfg.out)
    why = f"no sample carries a learning signal (zero reward spread everywhere, or no tokens): {counts}"
    log(f"{why}; the checkpoint is the input model unchanged")
    if os.environ.get("RANK", "0") != "0":
        return {"status": "ok", "out": str(out), "samples": 0, "unchanged": True}
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if Path(cfg.model).is_dir():
        shutil.copytree(cfg.model, tmp, copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("*.manifest.json", "update.json"))
    else:  # a hub id: load and save it as a plain directory
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoModelForCausalLM.from_pretrained(cfg.model).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(cfg.model).save_pretrained(tmp)
    report = {"metrics": None, "roles": None, "counts": counts, "config": asdict(cfg), "unchanged": True,
              "reason": why}
    atomic_write_text(tmp / "update.json", json.dumps(report, indent=2, default=str) + "\n")
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, out)
    stage.warnings.append(why)
    summary = {"status": "ok", "out": str(out), "samples": 0, "agent_samples": 0, "designer_samples": 0,
               "unchanged": True, "loss": None}
    stage.write_manifest(None, summary)
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


def run(cfg: UpdateConfig, force: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Update the model on the stored samples and write ``cfg.out``; returns the summary."""
    import json

    if log is None or os.environ.get("RANK", "0") != "0":  # one log, not one per process
        log = lambda _msg: None  # noqa: E731
    if not cfg.rollouts and not cfg.designs:
        raise SpadeError("nothing to train on: give --rollouts and/or --designs")
    if cfg.designs and not cfg.scores:
        raise SpadeError("--designs needs --scores (the Designer's reward comes from them)")
    for name, value, allowed in (("loss_type", cfg.loss_type, ("grpo", "bnpo", "dr_grpo", "dapo")),
                                 ("scale_rewards", cfg.scale_rewards, ("group", "batch", "none")),
                                 ("agent_episodes", cfg.agent_episodes, ("unhinted", "hinted", "both"))):
        if value not in allowed:
            raise SpadeError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    inputs = {k: expand_inputs(getattr(cfg, k)) if getattr(cfg, k) else [] for k in ("designs", "rollouts", "scores")}
    if Path(cfg.model).is_dir():
        inputs["model"] = [Path(cfg.model)]
    # Input paths are identified by content in the manifest; the config compares only the knobs.
    semantic = {k: v for k, v in asdict(cfg).items() if k not in ("designs", "rollouts", "scores", "out")}
    out = Path(cfg.out)
    stage = Stage.begin("update", out, semantic, inputs, force=force, out_kind="dir")
    if stage.check():
        return {"status": "up to date", "out": str(out)}

    t0 = time.time()
    samples, counts = collect_samples(cfg)
    if not samples:
        # Common early in a run (every return 0): nothing to learn is not a failure of the loop.
        return _pass_through(cfg, stage, counts, log, t0)
    log(f"{len(samples)} samples with signal: "
        + ", ".join(f"{r} {sum(s.role == r for s in samples)}" for r in ("agent", "designer")))
    trained = train(cfg, samples, log)
    report = {"metrics": trained["metrics"], "roles": trained["roles"], "counts": counts, "config": asdict(cfg)}
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    save(cfg, trained, tmp)
    accelerator = trained["accelerator"]
    summary = {"status": "ok", "out": str(out), "samples": len(samples),
               "agent_samples": sum(s.role == "agent" for s in samples),
               "designer_samples": sum(s.role == "designer" for s in samples),
               "loss": trained["metrics"]["loss"], "tokens_per_s": trained["metrics"]["tokens_per_s"]}
    if accelerator.is_main_process:
        atomic_write_text(tmp / "update.json", json.dumps(report, indent=2, default=str) + "\n")
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by killed runs
            if stale != tmp:
                shutil.rmtree(stale, ignore_errors=True)
        if out.exists():
            trash = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, out)
        stage.timings["train_s"] = trained["metrics"]["train_seconds"]
        stage.write_manifest(None, summary)
    accelerator.wait_for_everyone()
    summary["seconds"] = round(time.time() - t0, 2)
    return summary
