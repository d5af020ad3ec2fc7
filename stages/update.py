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
  An episode with an ``error`` counts as return 0 over the tokens the Agent generated before the
  failure, as regret scores it, so crashing an env never pays more than playing it badly; an env
  whose score row flags ``rollout_errors`` (too many failures: docs/architecture.md, 'Reason
  codes') is left out, since its episodes teach nothing.
  With ``agent_credit`` ``turn`` each reply is credited with its own discounted reward-to-go
  instead (``stages.update_samples``).
- Designer: one sample per design with tokens, grouped by ``group_id`` (designs sampled from
  one prompt), reward = the ``designer_reward`` of its ``env_id``. Invalid designs
  (``valid`` false or no code) get ``invalid_reward``; valid designs without a score row (never
  rolled out) are left out rather than guessed.
- Groups with zero reward spread are dropped; the rest get ``grpo.group_advantages``.

The loop is spade's own, not ``GRPOTrainer``: TRL has no offline mode and the two roles have
different masks and groupings in one batch. The loss is TRL's, term by term (``spade_cli.training.grpo``),
with old log-probs recomputed by the trainer and TRL's sampler correction (TIS) against the stored
sampler log-probs; log-probs come from TRL's fused LM head at each sample's temperature; device
placement, gradient accumulation, DeepSpeed and FSDP come from accelerate, so ``accelerate launch``
works unchanged. Modules: ``stages.update_samples`` (rows -> samples), ``stages.update_train``
(set-up and the optimizer pass), ``spade_cli.training.trainer_state`` (what survives between updates),
``stages.update_staleness`` (which checkpoint drew the samples and how many updates behind ``--model``
it is: 1 in the pipelined loop, recorded in ``update.json`` and bounded by ``--max-staleness``).

The output is the served checkpoint (the input's dtype) plus ``trainer_state/`` (fp32 masters,
Adam, scheduler, RNG), which the next update resumes when given this checkpoint as ``--model``.
It is built under a temporary name and renamed into place, so a killed run never leaves a half
checkpoint; a rerun after a kill starts the update over. A SIGTERM (Slurm's time limit or
preemption) is different: the pass stops before its next optimizer step, saves its state and
progress as ``OUT.partial-<confighash>/`` and exits 75; the rerun continues from there (on CPU,
bitwise to the weights of an uninterrupted run).

    spade update --model ckpt/iter_0000 --envs validated.jsonl --rollouts rollouts.jsonl \
      --scores scores.jsonl --out ckpt/iter_0001
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_cli.core import checkpoint, preempt, settings
from spade_cli.core.artifacts import (
    SpadeError,
    Stage,
    atomic_write_text,
    expand_inputs,
    later_defaults_dropped,
)
from stages import update_roles, update_staleness
from stages.update_config import UpdateConfig
from stages.update_samples import collect_samples

if TYPE_CHECKING:  # spade_cli.training.grpo imports torch: only inside functions here
    from spade_cli.training.grpo import Sample

__all__ = ["UpdateConfig", "collect_samples", "run", "train"]


def train(cfg: UpdateConfig, samples: list[Sample], log: Callable[[str], None], state: dict | None = None,
          base: str | None = None, partial: Path | None = None) -> dict:
    """Set up (resuming ``state`` when given) and take one pass; returns the pass's report plus the
    ``trainer`` that ``save`` writes. With ``partial``, a SIGTERM between optimizer steps saves the
    pass there and raises ``Preempted``, and a partial left by such a run is continued."""
    from spade_cli.training import trainer_state
    from stages import update_train

    present, beta = {s.role for s in samples}, update_roles.betas(cfg)
    tr = update_train.prepare(cfg, {s.temperature for s in samples}, state, base or _model_id(cfg.model),
                              kl=any(beta[r] != 0.0 for r in present))
    resumed = None
    if partial is not None and partial.is_dir():
        resumed = trainer_state.load_partial(tr.accelerator, partial)
        if resumed is None:
            log(f"{partial}: saved by another number of processes or unreadable; starting the pass over")
        else:
            log(f"resuming the preempted pass from {partial} (optimizer step {resumed['step']} done)")
    out = update_train.train_pass(tr, cfg, samples, log, partial, resumed)
    return {**out, "trainer": tr, "resumed_step": resumed["step"] if resumed else None}


def _model_id(model: str) -> str:
    return str(Path(model).resolve()) if Path(model).is_dir() else model


def save(cfg: UpdateConfig, tr: Any, tmp: Path) -> dict:
    """Write the trainer state and the served checkpoint (input dtype, tied embeddings tied,
    config dtype = tensor dtype, tokenizer) to ``tmp``; returns the state figures and the audit.
    Every process calls this (ZeRO-3 and FSDP save and gather collectively); the main one writes."""
    import json

    from spade_cli.training import trainer_state

    acc, model = tr.accelerator, tr.model
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    state_dir = tmp / trainer_state.STATE_DIR
    t0 = time.perf_counter()
    acc.save_state(str(state_dir))  # before a LoRA merge below changes the model
    info = {"save_s": round(time.perf_counter() - t0, 3),
            **{k: v for k, v in tr.timings.items() if k != "rss_before_load_mb"}}
    dtype = trainer_state.serving_dtype(cfg.model)
    if cfg.lora:
        state_dict, audit = None, None
    else:
        state_dict, audit = _served_and_audit(acc, model, dtype, tr.snapshots)
    from spade_cli.training import masters

    memory = masters.host_memory(acc, tr.timings.get("rss_before_load_mb", 0.0), tr.snapshots)
    if not acc.is_main_process:
        return info
    trainer_state.write_meta(state_dir, {**tr.counters, "lora": cfg.lora, "lora_r": cfg.lora_r if cfg.lora else None,
                                         "lora_alpha": cfg.lora_alpha if cfg.lora else None,
                                         "processes": acc.num_processes,
                                         "distributed_type": str(acc.distributed_type)})
    info["bytes"] = trainer_state.size_bytes(state_dir)
    unwrapped = acc.unwrap_model(model)
    if cfg.lora:  # merged, so vLLM, lm-eval and the next rollout load it without peft
        unwrapped = unwrapped.merge_and_unload()
        out_sd = trainer_state.served(unwrapped.state_dict(), dtype, trainer_state.tied_keys(unwrapped))
        trainer_state.refuse_nonfinite([k for k, t in out_sd.items() if t.is_floating_point() and not t.isfinite().all()])
    else:
        out_sd = state_dict
    unwrapped.save_pretrained(tmp, state_dict=out_sd)
    if dtype is not None:  # save_pretrained writes the dtype of the fp32 masters, not of the tensors
        config = json.loads((tmp / "config.json").read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        atomic_write_text(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    tr.tokenizer.save_pretrained(tmp)
    if audit is not None:
        info["audit"] = audit
    info["host_memory"] = memory
    return info


def _served_and_audit(acc: Any, model: Any, dtype: Any, snapshots: dict) -> tuple[dict | None, dict | None]:
    """The served state dict (on the main process; None elsewhere) from the real fp32 masters, one
    parameter at a time, and the audit from each process's share of the snapshots. Collective."""
    from spade_cli.training import masters, trainer_state

    out_sd: dict = {}
    local = [0.0] * len(masters.SUMS)
    before, m_before = snapshots.get("served_before"), snapshots.get("master_before")
    bad: list[str] = []
    for i, (name, master) in enumerate(masters.full(acc, model)):
        served = master.to(dtype) if dtype is not None else master
        if not served.isfinite().all():  # every process sees the full tensor: all refuse together
            bad.append(name)
        if acc.is_main_process:
            out_sd[name] = served
        if before is not None and masters.owns(acc, i):
            one = masters.sums({name: before[name]}, None if m_before is None else {name: m_before[name]},
                               {name: master}, {name: served})
            local = [a + b for a, b in zip(local, one, strict=True)]
    trainer_state.refuse_nonfinite(bad)
    audit = masters.figures(masters.reduce(acc, local)) if before is not None else None
    if not acc.is_main_process:
        return None, audit
    unwrapped = acc.unwrap_model(model)
    persistent = set(unwrapped.state_dict().keys())  # buffers saved with the weights (none in Qwen3)
    buffers = {k: b.detach().cpu() for k, b in unwrapped.named_buffers() if k in persistent}
    out_sd.update(trainer_state.served(buffers, dtype, trainer_state.tied_keys(unwrapped)))
    return out_sd, audit


def _main_pid(acc: Any) -> int:
    if acc.num_processes == 1:
        return os.getpid()
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([os.getpid()], from_process=0)[0]


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
              "reason": why, "staleness": stage.extra.get("staleness")}
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


def _resolve_state(cfg: UpdateConfig) -> tuple[dict | None, str]:
    """(the trainer state to resume or None, the run's base model for the KL reference)."""
    from spade_cli.training import trainer_state

    found = trainer_state.find(cfg.model) if Path(cfg.model).is_dir() else None
    base = (found or {}).get("base_model") or _model_id(cfg.model)
    if found is None or cfg.fresh_optimizer:
        return None, base
    trainer_state.check_resumable(found, cfg.lora, cfg.lora_r, cfg.lora_alpha)
    return found, base


def run(cfg: UpdateConfig, force: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Update the model on the stored samples and write ``cfg.out``; returns the summary."""
    if log is None or os.environ.get("RANK", "0") != "0":  # one log, not one per process
        log = lambda _msg: None  # noqa: E731
    if not cfg.rollouts and not cfg.envs:
        raise SpadeError("nothing to train on: give --rollouts and/or --envs")
    if cfg.envs and not cfg.scores:
        raise SpadeError("--envs needs --scores (the Designer's reward comes from them)")
    bad = settings.outside_choices(cfg)  # the Literal choices the command line checks, for library callers
    if bad:
        raise SpadeError(bad)
    for name, value in asdict(cfg).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SpadeError(f"--{name.replace('_', '-')} must be a finite number, got {value!r}")
    update_roles.stated_shares(cfg)  # refuses a share outside [0, 1]
    if not 0.0 <= cfg.turn_gamma <= 1.0:
        raise SpadeError(f"turn_gamma must lie in [0, 1], got {cfg.turn_gamma!r}")
    # the input roles keep the manifest's names ("designs": the --envs files)
    inputs = {role: expand_inputs(given) if given else []
              for role, given in (("designs", cfg.envs), ("rollouts", cfg.rollouts), ("scores", cfg.scores))}
    if Path(cfg.model).is_dir():
        inputs["model"] = [Path(cfg.model)]
    # Input paths are identified by content in the manifest; the config compares only the knobs
    # that change the output (pruning and the audit do not). The resumed trainer state is not an
    # input fingerprint: it is write-once, and pruning it later must not make this run stale.
    semantic = later_defaults_dropped({k: v for k, v in asdict(cfg).items()
                                       if k not in ("envs", "rollouts", "scores", "out", "keep_state_every",
                                                    "weight_audit", "max_staleness", "packing")}, "update")
    out = Path(cfg.out)
    stage = Stage.begin("update", out, semantic, inputs, force=force, out_kind="dir")
    if stage.check():
        return {"status": "up to date", "out": str(out)}

    t0 = time.time()
    # Which checkpoints drew the samples and how far behind --model they are (the pipelined loop
    # trains on samples one update old): recorded in update.json and the manifest, bounded on request.
    staleness = update_staleness.measure(cfg.model, cfg.rollouts if cfg.designer_share != 1.0 else [],
                                         cfg.envs if cfg.designer_share != 0.0 else [])
    update_staleness.check(staleness, cfg.max_staleness)
    stage.extra["staleness"] = staleness
    if force:
        _remove_partials(out)
    state, base = _resolve_state(cfg)
    samples, counts = collect_samples(cfg)
    # Before the weights are loaded or republished (the unchanged path copies them as the new
    # checkpoint); after the outputs and rows are checked, which name the more specific mistake.
    checkpoint.check(cfg.model)
    if not samples:
        # Common early in a run (every return 0): nothing to learn is not a failure of the loop.
        return _pass_through(cfg, stage, counts, log, t0)
    # From here a first SIGTERM waits for the next optimizer step (or for the publish, after the
    # last one): training up to it is kept in stage.partial for the rerun.
    with preempt.deferred():
        return _train_and_publish(cfg, stage, state, base, samples, counts, log, t0)


def _remove_partials(out: Path) -> None:
    for stale in out.parent.glob(f"{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _train_and_publish(cfg: UpdateConfig, stage: Stage, state: dict | None, base: str, samples: list[Sample],
                       counts: dict, log: Callable[[str], None], t0: float) -> dict:
    import json

    from spade_cli.training import trainer_state

    out = Path(cfg.out)
    log(f"{len(samples)} samples with signal: "
        + ", ".join(f"{r} {sum(s.role == r for s in samples)}" for r in ("agent", "designer"))
        + (f"; resuming the trainer state of {cfg.model} (update {state['updates']})" if state else
           "; fresh optimizer"))
    trained = train(cfg, samples, log, state, base, stage.partial)
    tr = trained["trainer"]
    # one name for every process: under ZeRO and FSDP each one writes its shard of the state there
    tmp = out.with_name(f".{out.name}.tmp-{_main_pid(tr.accelerator)}")
    try:
        saved = save(cfg, tr, tmp)
    except SpadeError:  # refused weights: the half-built directory goes, nothing is published
        if tr.accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    state_report = {"resumed": state["path"] if state else None, "fresh_optimizer": cfg.fresh_optimizer,
                    "updates": tr.counters["updates"], "optimizer_steps": tr.counters["optimizer_steps"],
                    "base_model": base, **{k: v for k, v in saved.items() if k not in ("audit", "host_memory")}}
    report = {"metrics": trained["metrics"], "roles": trained["roles"], "sampler": trained["sampler"],
              "trainer_state": state_report, "audit": saved.get("audit"), "host_memory": saved.get("host_memory"),
              "kl_reference": {"kind": cfg.kl_reference, "path": base if cfg.kl_reference == "base" else
                               _model_id(cfg.model), "via": tr.ref_kind} if tr.ref_kind else None,
              "staleness": stage.extra.get("staleness"), "counts": counts, "config": asdict(cfg)}
    accelerator = tr.accelerator
    summary = {"status": "ok", "out": str(out), "samples": len(samples),
               "agent_samples": sum(s.role == "agent" for s in samples),
               "designer_samples": sum(s.role == "designer" for s in samples),
               "loss": trained["metrics"]["loss"], "tokens_per_s": trained["metrics"]["tokens_per_s"],
               "designer_share": trained["roles"]["designer"]["share"],
               "resumed_state": state_report["resumed"], "resumed_step": trained["resumed_step"]}
    if accelerator.is_main_process:
        try:  # a non-finite figure means something upstream slipped through: publish nothing
            text = json.dumps(report, indent=2, default=str, allow_nan=False)
            json.dumps(summary, default=str, allow_nan=False)
        except ValueError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SpadeError(f"the update's figures hold NaN or infinity (loss {summary['loss']!r}); "
                             "nothing was published") from None
        atomic_write_text(tmp / "update.json", text + "\n")
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by killed runs
            if stale != tmp:
                shutil.rmtree(stale, ignore_errors=True)
        if out.exists():
            trash = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, out)
        _remove_partials(out)
        stage.timings["train_s"] = trained["metrics"]["train_seconds"]
        stage.extra["trainer_state"] = state_report
        stage.extra["roles"] = {r: {k: v[k] for k in ("share", "steps_with_samples", "step_weight", "beta")}
                                for r, v in trained["roles"].items()}
        stage.write_manifest(None, summary)
        # Only now is the input's state superseded by a published one.
        if cfg.keep_state_every and Path(cfg.model).is_dir() and trainer_state.prune(cfg.model, cfg.keep_state_every):
            log(f"pruned the superseded trainer state of {cfg.model} (--keep-state-every {cfg.keep_state_every})")
    accelerator.wait_for_everyone()
    summary["seconds"] = round(time.time() - t0, 2)
    return summary
