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
  instead (``spade_cli.training.samples``).
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
works unchanged.

This stage checks (the settings, the outputs, the staleness of the samples), computes (the library
in ``spade_cli/training/``: ``samples`` reads rows into samples, ``loop`` trains and builds the
checkpoint, ``trainer`` sets up and takes the optimizer pass, ``trainer_state`` is what survives
between updates, ``staleness`` finds which checkpoint drew the samples and how many updates behind
``--model`` it is: 1 in the pipelined loop, recorded in ``update.json`` and bounded by
``--max-staleness``) and publishes (``update.json``, the rename into place, the manifest).

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
from typing import TYPE_CHECKING

from spade_cli.core import checkpoint, preempt, settings
from spade_cli.core.artifacts import (
    SpadeError,
    Stage,
    atomic_write_text,
    expand_inputs,
    later_defaults_dropped,
)
from spade_cli.training import loop, role_balance, staleness
from spade_cli.training.config import UpdateConfig
from spade_cli.training.samples import collect_samples

if TYPE_CHECKING:  # spade_cli.training.grpo imports torch: only inside functions here
    from spade_cli.training.grpo import Sample

__all__ = ["UpdateConfig", "collect_samples", "run"]


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
    loop.copy_model(cfg.model, tmp)
    report = {"metrics": None, "roles": None, "counts": counts, "config": asdict(cfg), "unchanged": True,
              "reason": why, "staleness": stage.extra.get("staleness")}
    atomic_write_text(tmp / "update.json", json.dumps(report, indent=2, default=str) + "\n")
    _replace(tmp, out)
    stage.warnings.append(why)
    summary = {"status": "ok", "out": str(out), "samples": 0, "agent_samples": 0, "designer_samples": 0,
               "unchanged": True, "loss": None}
    stage.write_manifest(None, summary)
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


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
    role_balance.stated_shares(cfg)  # refuses a share outside [0, 1]
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
    behind = staleness.measure(cfg.model, cfg.rollouts if cfg.designer_share != 1.0 else [],
                               cfg.envs if cfg.designer_share != 0.0 else [])
    staleness.check(behind, cfg.max_staleness)
    stage.extra["staleness"] = behind
    if force:
        _remove_partials(out)
    state, base = loop.resolve_state(cfg)
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


def _replace(tmp: Path, out: Path) -> None:
    """Publish the checkpoint built at ``tmp`` as ``out``, moving an older one aside first."""
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, out)


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
    trained = loop.train(cfg, samples, log, state, base, stage.partial)
    tr = trained["trainer"]
    # one name for every process: under ZeRO and FSDP each one writes its shard of the state there
    tmp = out.with_name(f".{out.name}.tmp-{loop.main_pid(tr.accelerator)}")
    try:
        saved = loop.save(cfg, tr, tmp)
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
                               loop.model_id(cfg.model), "via": tr.ref_kind} if tr.ref_kind else None,
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
        _replace(tmp, out)
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
