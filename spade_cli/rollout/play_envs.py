"""Play every valid environment of a file k times without the hint and k times with it, into a
resumable rollout file: the core of `spade rollout` (``stages/rollout.py``), which `spade eval`
also runs on its held-out env suites (``envs:`` tasks), so both write the same rows.

Input: ``spade.validation/1`` rows (one or more files or globs: this iteration's validated
designs plus, for instance, a replay file of earlier environments). Only ``valid`` rows are
played; an env that appears twice (same ``env_id``) is played once. Output: one
``spade.rollout/1`` row per episode (docs/architecture.md, 'Records'), written as episodes finish.

Common random numbers: the k pairs of an env use k env seeds derived from (run seed, iteration,
env_id, pair), and the hinted and the unhinted episode of a pair share the seed, so the
hint-regret estimate measures the hint rather than the luck of the seed. ``episode_id`` comes from
the same tuple plus the hinted flag, so a rerun after ``kill -9`` finds the episodes already in
the partial output by id and plays only the missing ones.

``--shard I/N`` keeps the envs whose ``sha256(env_id) mod N == I``: every episode of an env lives
in one shard, so each Slurm array task writes a complete file of its own
(``rollouts.shard-II-of-NN.jsonl`` in a run directory, see ``spade paths``) and downstream stages
read them all with a glob.

Batching (``--batching``): ``lockstep`` advances all active episodes together, one batched
generate call per turn (hf, offline vllm: synchronous engines that want one big batch);
``continuous`` lets each episode advance on its own under ``max_concurrent``, its env steps
overlapping the others' generation (``openai``: the server batches what is in flight). ``auto``
picks continuous for backends whose class sets ``continuous = True``. Both give the same rows for
the same seeds when the backend's samples depend only on prompt and seed.

    rows = run(model="ckpt/tiny", envs=["validated.jsonl"], out="rollouts.jsonl", k=8)
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import InputError, SpadeError, Stage, expand_inputs, read_rows
from spade_cli.core.errors import check_rows
from spade_cli.core.layout import parse_shard
from spade_cli.core.records import ERROR_RETURN_RANGE, Validation
from spade_cli.rollout.episodes import (
    Engine,
    EnvSource,
    PlayConfig,
    Stats,
    budget_pairs,
    episode_specs,
    seed_key,
    seed_material,
)


def in_shard(env_id: str, shard: tuple[int, int]) -> bool:
    i, n = shard
    return int(hashlib.sha256(env_id.encode()).hexdigest()[:12], 16) % n == i


def load_envs(paths: list[Path], shard: tuple[int, int]) -> tuple[dict[str, EnvSource], dict]:
    """The valid envs of this shard, first occurrence wins; plus counts of what was skipped,
    (``key``) ``seed_material`` of every row, valid or not, in every shard: the seeds' key, and
    (``all_valid``) every shard's valid env ids, over which ``--budget-pairs`` is split."""
    envs: dict[str, EnvSource] = {}
    counts: dict = {"rows": 0, "invalid": 0, "duplicate": 0, "other_shard": 0, "key": [], "all_valid": {}}
    for path, line, rec in read_rows(paths, expect="spade.validation"):
        assert isinstance(rec, Validation)
        counts["rows"] += 1
        counts["key"].append(seed_material(rec))
        if not rec.valid:
            counts["invalid"] += 1
            continue
        if not rec.code:
            raise InputError(path, line, "a valid row without code")
        counts["all_valid"].setdefault(rec.env_id, None)  # every shard's: a budget is split over all
        if rec.env_id in envs:
            counts["duplicate"] += 1
        elif not in_shard(rec.env_id, shard):
            counts["other_shard"] += 1
        else:
            envs[rec.env_id] = EnvSource(rec.env_id, rec.code, rec.hint or "")
    return envs, counts


BATCHING = ("auto", "lockstep", "continuous")


def resolve_batching(batching: str, backend: Any) -> str:
    """``auto`` -> continuous for backends that schedule requests themselves (``continuous = True``
    on the backend), lockstep otherwise; an explicit mode is kept."""
    if batching == "auto":
        return "continuous" if getattr(backend, "continuous", False) else "lockstep"
    return batching


def _returns_summary(rows: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for side, hinted in (("unhinted", False), ("hinted", True)):
        vals = [r["return"] for r in rows if r.get("hinted") is hinted]
        out[f"{side}_mean"] = round(sum(vals) / len(vals), 4) if vals else None
    return out


def _prestart(pool: Any, episodes: int) -> None:
    from spade_cli.sandbox import SandboxUnavailable

    try:
        pool.prestart((0,), episodes=episodes)
    except (SandboxUnavailable, OSError):
        pass  # the first episode starts it again and reports it, in the stage's own thread

def run(
    model: str,
    envs: list[str | Path],
    out: str | Path,
    k: int = 8,
    *,
    budget: int | None = None,
    iteration: int = 0,
    seed: int = 0,
    backend: str = "hf",
    base_url: str | None = None,
    shard: str | None = None,
    play: PlayConfig | None = None,
    tier: str = "auto",
    min_tier: str = "process",
    scratch_mb: int = 64,
    force: bool = False,
    batching: str = "auto",
    progress: Callable[[Stats], None] | None = None,
    backend_obj: Any = None,
    backend_kwargs: dict | None = None,
    engine: Any = None,
    accept_foreign_server: bool = False,
) -> dict:
    """Play the episodes missing from ``out`` and publish it; returns the summary dict.

    ``backend_obj`` lets a library caller (or the benchmark) pass an already loaded backend.
    """
    if k < 1:
        raise ValueError("--k must be at least 1")
    if batching not in BATCHING:
        raise ValueError(f"--batching must be one of {', '.join(BATCHING)}, got {batching!r}")
    play = play or PlayConfig(seed=seed)
    lo, hi = ERROR_RETURN_RANGE  # readers refuse rows outside it (records.return_problem)
    if not lo <= play.error_return <= hi:
        raise ValueError(f"--error-return must lie in [{lo:g}, {hi:g}], got {play.error_return}")
    if play.seed != seed:
        play = PlayConfig(**{**play.__dict__, "seed": seed})
    shard_t = parse_shard(shard)
    paths = expand_inputs(envs)
    if budget is not None and budget < 1:
        raise ValueError("--budget-pairs must be at least 1")
    check_rows(2 * k, f"--k {k}", "episodes", "lower it")  # even one env: refused before the inputs are read
    config = {"model": str(model), "k": k, "budget_pairs": budget, "iteration": iteration, "seed": seed, "backend": backend,
              "shard": f"{shard_t[0]}/{shard_t[1]}", "tier": tier, "min_tier": min_tier, "batching": batching,
              "scratch_mb": scratch_mb,
              **{f: v for f, v in play.__dict__.items() if f not in ("seed", "max_concurrent", "workers")}}
    inputs: dict[str, list] = {"envs": paths}
    if Path(model).is_dir():
        inputs["model"] = [Path(model)]
    stage = Stage.begin("rollout", out, config, inputs, force=force)
    if stage.check():
        return {"status": "up to date", "out": str(out)}

    env_map, counts = load_envs(paths, shard_t)
    pairs = budget_pairs(list(counts.pop("all_valid")), budget) if budget is not None else k
    episodes = 2 * (sum(pairs.get(e, 0) for e in env_map) if isinstance(pairs, dict) else k * len(env_map))
    check_rows(episodes, f"{'--budget-pairs ' + str(budget) if budget is not None else '--k ' + str(k)} "
               f"over {len(env_map)} env(s)", "episodes", "lower it, or split the envs over processes with --shard I/N")
    specs = episode_specs(list(env_map), pairs, seed, iteration, seed_key(counts.pop("key")))
    done_rows = stage.resume()
    done = {r.get("episode_id") for r in done_rows}
    todo = [s for s in specs if s.episode_id not in done]
    rows = list(done_rows)
    stats = Stats(total=len(todo))
    tier_used = mode = None
    checked: dict[str, Any] = {}
    if todo:
        from spade_cli.backends import load_backend
        from spade_cli.core.records import to_row
        from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool, SandboxUnavailable
        from spade_cli.sandbox.supervisor import heavy_imports

        try:  # the sandbox first: a machine that cannot confine envs fails before loading a model
            pool = SandboxPool(SandboxConfig(tier=tier, min_tier=min_tier,
                                             max_action_chars=max(play.max_action_chars, 1), scratch_mb=scratch_mb,
                                             preimport=heavy_imports(e.code for e in env_map.values())))
        except SandboxUnavailable as exc:
            raise SpadeError(f"sandbox unavailable: {exc}") from None
        tier_used = pool.tier
        stage.warnings += pool.warnings
        bk = backend_obj
        # The zygote pre-imports numpy and gymnasium (most of a second) while the model loads, and
        # forks the env processes of the first tick's episodes, which confine themselves meanwhile.
        starter = threading.Thread(target=_prestart, args=(pool, min(play.max_concurrent, len(todo))),
                                   daemon=True)
        starter.start()
        try:
            if bk is None:
                kw = dict(backend_kwargs or {})
                if base_url:
                    kw["base_url"] = base_url
                if engine is not None and backend == "vllm":  # EngineOptions: every visible GPU by default
                    kw.update(engine.backend_kwargs())
                    stage.extra["engine"] = engine.record()
                bk = load_backend(backend, model, **kw)
            from spade_cli.backends import Sampling, preflight, sampling_record

            sampling = Sampling(temperature=play.temperature, top_p=play.top_p, top_k=play.top_k)
            # before any episode is played; a caller's backend (eval's held-out suites) samples
            # rows nobody trains on, so only the server is checked there
            checked = preflight(bk, sampling if backend_obj is None else None, accept_foreign_server)
            stage.extra.update({k: v for k, v in checked.items() if k == "server"})
            with stage.writer() as writer:
                def emit(rec: Any) -> None:
                    # read at each row: an openai backend learns its wire mode from its first answer
                    rec.extra["sampling"] = {**sampling_record(sampling, bk), "max_new_tokens": play.max_tokens}
                    row = to_row(rec)
                    writer.write(row)
                    rows.append(row)

                mode = resolve_batching(batching, bk)
                engine = Engine(bk, pool, env_map, play, emit, progress, env_error=EnvError, batching=mode)
                t0 = time.perf_counter()
                try:
                    stats = engine.run(todo)
                except SandboxUnavailable as exc:  # infrastructure, never an env's fault
                    raise SpadeError(f"sandbox failed mid-run: {exc}; rerun to resume") from None
                stage.timings.update(play_s=round(time.perf_counter() - t0, 3),
                                     generate_s=round(stats.gen_s, 3), env_s=round(stats.env_s, 3))
        finally:
            starter.join()  # a zygote finishing its start after close() would outlive the pool
            pool.close()
            if backend_obj is None and bk is not None and hasattr(bk, "close"):
                bk.close()
    if len(rows) != len(specs):
        raise SpadeError(f"rollout ended with {len(rows)} of {len(specs)} episodes; rerun to resume")
    errors: dict[str, int] = {}
    for r in rows:
        if r.get("error"):
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    summary = {
        "status": "ok", "out": str(out), "envs": len(env_map), "episodes": len(rows),
        "played": len(todo), "resumed": len(done_rows), "skipped": counts,
        **_returns_summary(rows), "errors": errors, "quarantined": stats.quarantined,
        "turns": stats.turns, "generate_calls": stats.calls, "gen_tokens": stats.gen_tokens,
        "gen_tokens_per_s": round(stats.gen_tokens / stats.gen_s, 1) if stats.gen_s else None,
        "sandbox_tier": tier_used, "batching": mode, "logprobs": checked.get("logprobs"),
    }
    stage.extra["sandbox"] = {"tier": tier_used}
    stage.extra["batching"] = mode
    stage.commit(len(rows), summary)
    return summary
