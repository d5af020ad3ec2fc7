"""Stage `regret`: rollouts -> the Designer's reward per environment, the memory, replay, diversity.

Inputs: the iteration's ``validated.jsonl`` (``--envs``: every design with its verdict), its
rollouts (one file, several, or a glob of shards), optionally ``--played`` (envs the rollout played
beside the designs: the replay file, a fixed set such as the quickstart's starter envs) and
``--memory``, the memory as of this iteration. Only the iteration's own designs are scored: a
played env gets no score row and counts in no mean, no Vendi score and no Designer reward; a past
design among them (an env already in memory) gets its history entry, so the memory shows how the
Agent does on it over time; any other played env never enters the memory. A row of ``--envs`` that
carries a replay mark, or that belongs to another iteration, is no design either: the first is
taken as played, the second refused (a fixed set passed there by hand is named). Outputs:

- ``scores.jsonl``: one ``spade.score/1`` row per design, in input order, so the
  Designer's GRPO groups stay complete. Invalid designs (parse failures included) get
  ``invalid_reward``. A valid env whose rollouts cannot define the signal (none at all, or one side
  missing) gets 0.0, the neutral reward, and ``note`` says why; the run warns about it.
- ``--memory-out``: the memory after this iteration, a new file (docs/architecture.md, 'Write-once files, manifests and resumption'). Every valid env of
  this iteration with rollouts, and every played env already in the memory, gets its history
  entry for this iteration; an entry for this iteration already in the input is replaced, not
  doubled. Memory rows also store the env's ``code`` (an extra field) so that replay can hand it to
  the next rollout.
- ``--replay-out`` (with ``--replay K``): the K most promising envs of the merged memory, as
  ``spade.validation/1`` rows for the next iteration (see ``curriculum.replay_priorities``).
- Diversity (Vendi score and Vendi/n over all of the iteration's designs, invalid and duplicate
  ones included, played envs left out) in the summary line and the manifest, with the embedding that ran.

``--before-rollouts`` (ema_lp only): the previous checkpoint's rollouts of the same envs on the same
seeds; their unhinted success opens the history of an env played for the first time, so its
learning progress is the change over the Agent's last update (docs/regret.md).

No file is both read and written: the memory of iteration i is an input like any other, fingerprinted
by its hash, and the memory after iteration i is a side output recorded (path and sha256) in the
manifest of ``scores.jsonl``. A rerun after success is "up to date"; a side output that was lost is
written again from the same inputs. The loop names the versions through ``spade paths``
(``memory`` and ``next_memory``, runs/NAME/memory/iter_0007.jsonl).

Rollouts are streamed: each line is hashed for the manifest and parsed in the same pass, and the
token arrays (the bulk of every row) are cut out unparsed when they form a flat object of numbers,
so 100k rows take seconds (recipes/bench_regret.py; the scan lives in ``spade_cli.rollout.rollout_scan``).
Only (env_id, hinted, pair, return, error) is kept per episode; a repeated ``episode_id`` is counted
once when identical and refused when not. Formulas and design choices: docs/regret.md.

Example::

    spade regret --envs it3/validated.jsonl --played it2/replay.jsonl --rollouts 'it3/rollouts*.jsonl' \\
        --out it3/scores.jsonl --memory run/memory/iter_0003.jsonl --memory-out run/memory/iter_0004.jsonl \\
        --replay 4 --replay-out it3/replay.jsonl
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from spade_cli.checks import diversity
from spade_cli.core.artifacts import (
    InputError,
    SpadeError,
    Stage,
    check_output,
    expand_inputs,
    manifest_path,
    read_rows,
    sha256_file,
    write_jsonl,
)
from spade_cli.core.records import (
    Memory,
    Score,
    Validation,
    to_row,
)
from spade_cli.designer import curriculum
from spade_cli.rollout.rollout_scan import scan_rollouts
from spade_cli.rollout.seeds import seed_key, seed_material

STAGE = "regret"


# -- memory ----------------------------------------------------------------------------------------
def load_memory(path: Path | None) -> list[dict]:
    if path is None:
        return []
    return [to_row(rec) for _, _, rec in read_rows(path, expect="spade.memory")]


def strip_iteration(rows: list[dict], iteration: int) -> list[dict]:
    """Memory as it was before this iteration's merge (rows keep their place; empty ones remain)."""
    return [{**r, "history": [e for e in r.get("history") or [] if e.get("iteration") != iteration]}
            for r in rows]


def _kept(rows: list[dict], iteration: int) -> list[dict]:
    return [r for r in rows if r["history"] or r.get("first_iteration") != iteration]


def merge_memory(rows: list[dict], iteration: int, played: dict[str, dict], new_envs: dict[str, Validation],
                 ) -> list[dict]:
    """Upsert this iteration's history entry of every played env; idempotent by construction."""
    base = strip_iteration(rows, iteration)
    by_id = {r["env_id"]: r for r in base}
    for env_id, rec in new_envs.items():
        if env_id in by_id or env_id not in played:
            continue
        row = to_row(Memory(env_id=env_id, title=rec.title, hint=rec.hint,
                            doc_id=(rec.doc or {}).get("id"), first_iteration=iteration))
        row["code"] = rec.code
        row["ast_hash"] = rec.stats.get("ast_hash")  # validate compares new designs to it
        if curriculum.spec_of(rec):  # replay and the report read a spec design's level from here
            row["spec"] = curriculum.spec_of(rec)
        base.append(row)
        by_id[env_id] = row
    for env_id, s in played.items():
        row = by_id[env_id]
        if env_id in new_envs and not row.get("code"):
            row["code"] = new_envs[env_id].code
        row["first_iteration"] = min(row.get("first_iteration", iteration), iteration)
        entry = {"iteration": iteration, "unhinted_mean": s["unhinted_mean"], "hinted_mean": s["hinted_mean"],
                 "regret": s["regret"], "regret_ci95": s["regret_ci95"], "hinted_n": s["hinted_n"],
                 "unhinted_n": s["unhinted_n"], "unhinted_success": s["unhinted_success"]}
        row["history"] = sorted([*row["history"], entry], key=lambda e: e.get("iteration", 0))
    return _kept(base, iteration)


def _seed_audit(valid: dict[str, Validation], per_env: dict[str, dict], k: int, key: str) -> dict[str, dict]:
    """``audits.seed_invariance`` for every valid env with a successful hinted episode."""
    from spade_cli.checks import audits

    where = {e: st["best_at"] for e, st in per_env.items()
             if e in valid and valid[e].code and st.get("best_ret", 0.0) >= audits.SOLVED}
    seeds: dict[str, int] = {}
    actions = {e: a for e, a in audits.read_actions(where, seeds).items() if a}
    if not actions:
        return {}
    from spade_cli.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable

    try:
        with SandboxPool(SandboxConfig(tier="auto")) as pool:
            out = audits.seed_invariance({e: (valid[e].code, a) for e, a in actions.items()}, pool,
                                         run_seed=0, k=k, key=key)
            form = audits.form_only({e: (valid[e].code, seeds[e], a) for e, a in actions.items() if e in seeds},
                                    pool)
            for e, f in form.items():  # the content-free replay of the same episode (docs/regret.md)
                out[e]["form_replay"] = f
            return out
    except SandboxUnavailable as exc:
        raise SpadeError(f"the seed audit needs the sandbox ({exc}); pass --no-seed-audit to skip it") from None


# -- the stage -------------------------------------------------------------------------------------
def split_envs(env_paths: list[Path], played_paths: list[Path], given: int | None,
               ) -> tuple[list[Validation], dict[str, Validation], int]:
    """The iteration's designs (rows of ``--envs``), the valid envs only played beside them (rows of
    ``--played``, and rows of ``--envs`` with a replay mark) and the iteration number.

    Every design must belong to the iteration (``given``, else its first design's): a fixed set or
    an old validated file given as ``--envs`` is refused at its first row, since scoring it would
    put envs the Designer never wrote into its reward, memory and Vendi score."""
    designs, played = [], {}
    it = given
    for path, line, rec in read_rows(env_paths, expect="spade.validation"):
        assert isinstance(rec, Validation)
        if "replay" in rec.extra:  # written by --replay-out: a past design, whichever flag brings it
            if rec.valid:
                played.setdefault(rec.env_id, rec)
            continue
        it = rec.iteration if it is None else it
        if rec.iteration != it:
            raise InputError(path, line, f"env {rec.env_id} is of iteration {rec.iteration}, but --envs holds "
                             f"the designs of iteration {it}: pass a fixed or past env set with --played")
        designs.append(rec)
    for _, _, rec in read_rows(played_paths, expect="spade.validation"):
        assert isinstance(rec, Validation)
        if rec.valid:  # rollout plays only valid envs
            played.setdefault(rec.env_id, rec)
    return designs, played, 0 if it is None else it


def shuffle_earned(rows: list[dict], iteration: int) -> None:
    """The control arm of the steering experiment (docs/curriculum.md): the rewards the signal gave
    (valid, unflagged designs) are permuted among those designs, so validity is still paid but the
    choice of task is not. The permutation is seeded by the iteration and the designs; each row keeps
    its own reward in ``designer_reward_earned``."""
    import random

    earned = [r for r in rows if r["note"] is None]
    rewards = [r["designer_reward"] for r in earned]
    random.Random(f"shuffle|{iteration}|{'|'.join(r['env_id'] for r in earned)}").shuffle(rewards)
    for r, x in zip(earned, rewards, strict=True):
        r["designer_reward_earned"], r["designer_reward"] = r["designer_reward"], x


def run(envs: str | Path | list, rollouts: str | Path | list, out: str | Path,
        played: str | Path | list | None = None, memory: str | Path | None = None, memory_out: str | Path | None = None, signal: str = "regret",
        clip_negative: bool = False, invalid_reward: float = -1.0,
        iteration: int | None = None, success_threshold: float = 0.5, replay: int = 0,
        replay_out: str | Path | None = None, replay_temperature: float = 0.1, replay_staleness: float = 0.1,
        embedding: str = "auto", audit: bool = True, audit_seeds: int = 4, flagged_reward: float | None = None,
        max_error_rate: float = 0.25, before_rollouts: str | Path | list | None = None,
        shuffle_rewards: bool = False, pool_cells: tuple[str, ...] = (), force: bool = False) -> dict:
    """Score one iteration; returns the summary dict (also stored in the manifest)."""
    t0 = time.time()
    if signal not in curriculum.SIGNALS:
        raise SpadeError(f"unknown signal {signal!r}; choose {', '.join(curriculum.SIGNALS)}")
    if replay and replay_out is None:
        raise SpadeError("--replay K needs --replay-out FILE")
    if not 0.0 <= max_error_rate <= 1.0:
        raise SpadeError(f"--max-error-rate must lie in [0, 1], got {max_error_rate}")
    out = Path(out)
    mem_out = Path(memory_out) if memory_out else None
    replay_path = Path(replay_out) if replay and replay_out else None
    env_paths, roll_paths = expand_inputs(envs), expand_inputs(rollouts)
    played_paths = expand_inputs(played) if played else []
    before_paths = expand_inputs(before_rollouts) if before_rollouts else []
    if pool_cells and signal == "ema_lp":  # ema_lp follows one env across iterations, not a cell
        raise SpadeError("--pool-cells pools the regret or learnability signal, not ema_lp")
    if before_paths and signal != "ema_lp":
        raise SpadeError("--before-rollouts feeds the ema_lp signal; pass --signal ema_lp")
    mem_path = Path(memory) if memory else None
    if mem_path and not mem_path.is_file():  # a typo must not pass for the empty memory of iteration 0
        raise InputError(mem_path, None, "no such memory file (omit --memory when there is none yet)")
    mem = [mem_path] if mem_path else []
    # every output checked before the scan: a typo in --out must not cost a pass over the rollouts
    ins = [*env_paths, *played_paths, *roll_paths, *before_paths, *mem]
    check_output(out, ins)
    if mem_out:  # write-once: the memory after this iteration is a new file, never the input
        check_output(mem_out, [*ins, out], flag="--memory-out")
    if replay_path:
        check_output(replay_path, [*ins, out, *([mem_out] if mem_out else [])], flag="--replay-out")
    designs, also, it = split_envs(env_paths, played_paths, iteration)
    mem_rows = load_memory(mem_path)
    valid = {r.env_id: r for r in designs if r.valid}
    in_memory = {r["env_id"] for r in mem_rows}
    known = set(valid) | set(also) | in_memory
    t_read = time.time()
    warnings: list[str] = []
    per_env, roll_fps = scan_rollouts(roll_paths, known, warnings=warnings)
    before, before_fps = scan_rollouts(before_paths, known, warnings=warnings) if before_paths else ({}, [])
    t_scan = time.time()

    config = {"signal": signal, "clip_negative": clip_negative, "invalid_reward": invalid_reward,
              "iteration": it, "success_threshold": success_threshold, "replay": replay,
              "replay_out": str(replay_path) if replay_path else None,
              "replay_temperature": replay_temperature,
              "replay_staleness": replay_staleness, "embedding": embedding,
              "embedding_used": diversity.resolve_embedding(embedding),
              "memory_out": str(mem_out) if mem_out else None, "seed_audit": audit, "audit_seeds": audit_seeds,
              "flagged_reward": invalid_reward if flagged_reward is None else flagged_reward,
              "max_error_rate": max_error_rate, **({"shuffle_rewards": True} if shuffle_rewards else {}),
              **({"pool_cells": list(pool_cells)} if pool_cells else {})}
    # the rollouts were hashed during the scan: their fingerprints are passed, not taken again
    inputs: dict[str, list[Path]] = {"envs": env_paths, "rollouts": roll_paths}
    if played_paths:
        inputs["played"] = played_paths
    if before_fps:
        inputs["before_rollouts"] = before_paths
    if mem_path:
        inputs["memory"] = [mem_path]
    stage = Stage.begin(STAGE, out, config, inputs, force=force, started=t0,
                        hashed={"rollouts": roll_fps, "before_rollouts": before_fps})
    if stage.check():
        old = json.loads(manifest_path(out).read_text())
        side = old.get("side_outputs", {})
        if all(Path(p).exists() and sha256_file(p) == sha for p, sha in side.items()):
            return {**old.get("summary", {}), "status": "up to date", "out": str(out)}
        stage.force = True  # a side output was lost or altered: write it again from the same inputs
        stage.lock()

    stats = {e: curriculum.env_stats(per_env.get(e), success_threshold) for e in valid}
    played = {e: s for e, s in stats.items() if s["hinted_n"] or s["unhinted_n"]}
    # envs played beside the designs: measured, never scored; a past design among them (in memory)
    # gets this iteration's history entry
    others = {e: curriculum.env_stats(st, success_threshold) for e, st in per_env.items() if e not in valid}
    replayed = {e: s for e, s in others.items() if e in in_memory}
    # the failed-episode rule: an env that breaks under play in too many episodes is invalid (and
    # gets no seed audit: its reward is already the invalid one)
    broken = {e: a for e, s in {**stats, **others}.items()
              if (a := curriculum.rollout_error_audit(s, max_error_rate)) is not None}
    broken_played = sorted(e for e in broken if e not in valid)
    t_audit = time.time()
    audited = _seed_audit({e: v for e, v in valid.items() if e not in broken}, per_env, audit_seeds,
                          seed_key(map(seed_material, designs))) if audit else {}
    flags = {e: [f for f, hit in (("format_only", (a.get("form_replay") or {}).get("format_only")),
                                  ("seed_invariant", a["seed_invariant"])) if hit]
             for e, a in audited.items()}
    flags = {e: f for e, f in flags.items() if f}
    flags.update({e: ["rollout_errors"] for e in broken})
    audited.update(broken)
    t_audit = time.time() - t_audit
    merged = merge_memory(mem_rows, it, {**played, **replayed}, valid)
    for r in merged:  # a flagged env keeps its flags in memory: never replayed, never "learnable"
        if r["env_id"] in flags:
            r["flags"] = sorted({*r.get("flags", []), *flags[r["env_id"]]})
    # the unhinted success per iteration for ema_lp; merged holds every played env even without --memory
    history = {r["env_id"]: [h["unhinted_success"] for h in r["history"]
                             if h.get("unhinted_success") is not None] for r in merged}
    # ema_lp with --before-rollouts: the previous Agent's success on the same seeds opens the history
    # of an env played for the first time (docs/regret.md): it scores the progress of the Agent's
    # last update on it
    prior = {e: p for e, st in before.items()
             if e in valid and (p := curriculum.env_stats(st, success_threshold)["unhinted_success"]) is not None}

    # --pool-cells: an unflagged spec design is paid its cell's regret (flagged ones stay out of pools)
    cells = {e: k for e, v in valid.items() if e in played and e not in flags
             and (k := curriculum.cell_key(v, pool_cells)) is not None} if pool_cells else {}
    pooled = curriculum.cell_stats(cells, per_env, success_threshold)
    rows = []
    for rec in designs:
        s = stats[rec.env_id] if rec.valid else curriculum.env_stats(per_env.get(rec.env_id),
                                                                     success_threshold)
        note = None
        if not rec.valid:
            reward, note = invalid_reward, f"invalid: {rec.reason or rec.parse_error or 'unknown'}"
        elif rec.env_id in broken:  # failure rule 2: treated as invalid, whatever --flagged-reward says
            reward, note = invalid_reward, "flagged: rollout_errors"
        elif rec.env_id in flags:
            reward, note = config["flagged_reward"], f"flagged: {', '.join(flags[rec.env_id])}"
        else:
            s_hist = history.get(rec.env_id, [])
            if rec.env_id in prior and len(s_hist) == 1:  # a longer history already has its own past
                s_hist = [prior[rec.env_id], *s_hist]
            reward = curriculum.designer_reward(signal, {**pooled.get(rec.env_id, s), "success_history": s_hist},
                                                clip_negative)
            if reward is None:
                note = "no rollouts" if not (s["hinted_n"] or s["unhinted_n"]) else "one side has no rollouts"
                warnings.append(f"env {rec.env_id}: {note}; designer_reward 0.0")
                reward = 0.0
        if not math.isfinite(reward):  # a NaN flag or memory entry: no score is better than poison
            raise SpadeError(f"env {rec.env_id}: designer_reward {reward!r} is not finite (from --invalid-reward, "
                             "--flagged-reward or the memory's history); nothing was written")
        score = Score(env_id=rec.env_id, iteration=it, signal=signal, hinted_mean=s["hinted_mean"],
                      unhinted_mean=s["unhinted_mean"], hinted_n=s["hinted_n"], unhinted_n=s["unhinted_n"],
                      regret=s["regret"], regret_ci95=s["regret_ci95"], designer_reward=float(reward),
                      extra={"group_id": rec.group_id, "sample": rec.sample, "valid": rec.valid,
                             "paired": s["paired"], "unhinted_success": s["unhinted_success"],
                             "hinted_success": s["hinted_success"], "hinted_errors": s["hinted_errors"],
                             "unhinted_errors": s["unhinted_errors"], "note": note,
                             "flags": flags.get(rec.env_id, []), "audit": audited.get(rec.env_id),
                             **({"before_success": prior.get(rec.env_id)} if before_paths else {}),
                             **({"cell": {k: pooled[rec.env_id][k] for k in ("cell_envs", "regret", "regret_ci95")}}
                                if rec.env_id in pooled and rec.valid else {})})
        rows.append(to_row(score))

    if shuffle_rewards:
        shuffle_earned(rows, it)
    # every design of the iteration, invalid ones and duplicates included: collapse must show
    texts = [diversity.design_parts(r.title, r.code, r.hint, r.completion) for r in designs]
    div = diversity.diversity(texts, embedding)

    done = stage.resume()
    if [r["env_id"] for r in done] != [r["env_id"] for r in rows[:len(done)]]:
        stage.partial.unlink(missing_ok=True)  # not a prefix of this run's output: start over
        done = []
    with stage.writer() as w:
        for row in rows[len(done):]:
            w.write(row)
    side: dict[str, str] = {}
    if mem_out:
        write_jsonl(mem_out, merged)
        side[str(mem_out)] = sha256_file(mem_out)
    picked = []
    if replay_path:
        invalid_now = {r.env_id for r in designs if not r.valid}
        picked = curriculum.select_replay(merged, it, replay, invalid_now, replay_temperature,
                                          replay_staleness)
        write_jsonl(replay_path, picked)
        side[str(replay_path)] = sha256_file(replay_path)

    rewards = [r["designer_reward"] for r in rows]
    regrets = [r["regret"] for r in rows if r["regret"] is not None]
    summary = {"status": "ok", "stage": STAGE, "out": str(out), "rows": len(rows), "iteration": it,
               "signal": signal, "valid": len(valid), "invalid": len(designs) - sum(r.valid for r in designs),
               "no_rollouts": sum(1 for r in rows if r["note"] and "rollouts" in r["note"]),
               "episodes": sum(len(v) for st in per_env.values() for k in ("h", "u") for v in st[k].values()),
               "played_envs": len(others), "replayed_played": len(replayed), "before_envs": len(prior) if before_paths else None,
               "designer_reward_mean": curriculum.mean(rewards), "regret_mean": curriculum.mean(regrets),
               "memory_envs": len(merged) if mem_out else None, "replay": len(picked),
               "vendi": div["vendi"], "vendi_per_n": div["vendi_per_n"], "embedding": div["embedding"],
               "resumed_rows": len(done),
               "episodes_failed": sum(st["h_err"] + st["u_err"] for st in per_env.values()),
               "envs_rollout_errors": len(broken) - len(broken_played),
               "played_rollout_errors": len(broken_played),
               "audited": len(audited) - len(broken),
               "flagged": {f: sum(f in fl for e, fl in flags.items() if e in valid)
                           for f in ("seed_invariant", "format_only", "rollout_errors")},
               "warnings": warnings}
    stage.warnings.extend(warnings)
    stage.timings.update({"read_s": round(t_read - t0, 3), "scan_s": round(t_scan - t_read, 3),
                          "audit_s": round(t_audit, 3)})
    # played envs that broke under play: no score row carries their flag (docs/regret.md)
    stage.extra.update({"diversity": div, "side_outputs": side, "played_rollout_errors": broken_played})
    summary["seconds"] = round(time.time() - t0, 3)
    stage.commit(len(rows), summary)
    return summary
