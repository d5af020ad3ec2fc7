"""`spade validate`: judge every designed environment in the sandbox, with a reason when it fails.

Input: ``spade.design/1`` rows (the minimal form ``{"schema", "code", "hint"}`` is enough).
Output: exactly one ``spade.validation/1`` row per input row, in input order, carrying every
design field plus ``valid``, ``reason`` (null or a code of docs/architecture.md, 'Reason codes'), ``checks`` (each
``{name, ok, detail, ms}`` in the order run; the first failure is the reason) and ``stats``.

The checks, in order:

1. ``code``, ``size``, ``syntax``, ``env_class`` — static, no process started (``no_code``,
   ``too_large``, ``syntax_error``, ``no_env_class``).
2. ``import`` — the source runs in its own confined process (``import_error``, ``import_timeout``,
   ``no_env_class`` when not exactly one ``gymnasium.Env`` subclass is defined, ``output_flood``).
3. ``contract`` — episodes under a scripted policy, two degenerate ones (empty text, a fixed
   string) and random text; every reset/step result is checked (types, arity, finite real reward,
   bool flags, JSON-safe info, bounded observation, deadlines). The import's process plays the
   first of them.
4. ``gym_check_env`` — gymnasium's own checker when the env declares its spaces, in the last
   contract episode's process after that episode; advisory, its warnings land in ``stats.warnings``.
5. ``return_range`` — every episode's return lies in [0, 1].
6. ``determinism`` — the scripted episode again, in a process started with another
   ``PYTHONHASHSEED``; any difference is ``nondeterministic``. Every probe episode runs in a fresh
   process forked from the zygote, with a seed drawn as rollout draws it.
7. ``hint_leak``, ``no_hint``, ``trivial`` (a degenerate or random policy reaches
   ``trivial_return`` on its seed and on 2 of 3 more), ``hint_is_answer`` and ``format_only``
   (replies made from the hint alone, or with no task content, reach it on two seeds:
   ``spade_cli/checks/probes.py``), ``answer_table`` (the hint read as a table keyed by what the
   observation shows solves 3 of 4 seeds and a miss teaches nothing: ``stages/validate_hacks.py``).

``duplicate`` runs right after the static checks, before any process starts: a design whose
code, up to names, constants, messages, dead code, unread names, the order of definitions, comments
and formatting (``spade_cli/checks/astnorm.py``), is the code of
an env in ``--memory`` or of an earlier row of this input is a duplicate, whatever its hint; the
first one wins and the check names the env it matched. Memory rows are compared by their
``ast_hash`` field when it was made by the current normalisation, else by hashing their ``code``,
and always by ``env_id``. Every parsed design's hash is stored in ``stats.ast_hash`` (and the
match in ``stats.duplicate_of``), so that regret can keep it in the memory. Pool rows
(``gen.backend == "pool"``) are not Designer output: a pool deals copies and one-template
reasoning-gym tasks on purpose, so among themselves only identical code is a duplicate. A second
key, after the checks: a design still valid whose transcript under the scripted policy, on a seed
shared by the input's designs, matches an earlier valid row's (text normalised) is a duplicate too
(``spade_cli/checks/behaviour.py``; check ``duplicate_behaviour``, ``stats.behaviour``).

Example::

    summary = run("designs.jsonl", "validated.jsonl", workers=2)
"""

from __future__ import annotations

import ast
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spade_cli.checks import astnorm, behaviour, probes
from spade_cli.core.artifacts import SpadeError, Stage, expand_inputs, read_rows
from spade_cli.core.records import Design, Memory, env_id_for, to_row, validation_from
from spade_cli.rollout.seeds import episode_seed, seed_key, seed_material
from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool, SandboxUnavailable
from spade_cli.sandbox.checks import hint_leaks, normalize, return_in_range
from spade_cli.sandbox.envproc import PARSE_LOCK
from spade_cli.sandbox.play import play
from spade_cli.sandbox.supervisor import heavy_imports
from stages import validate_hacks

SCRIPTED = ["", "1", "yes", "look", "0", "a", "hello world", "2", "no",
            '{"tool": "search", "arguments": {"query": "x"}}', "north", "42", "help", "b", "3", "quit"]
FIXED = "1"
VALIDATION_ITERATION = -1  # validation's seeds come from episode_seed like rollout's, in an iteration of their own


class Checks:
    """The ``checks`` list of one row; ``fail`` records the reason and stops the run."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.reason: str | None = None

    def add(self, name: str, ok: bool, detail: str, t0: float, reason: str | None = None) -> bool:
        self.items.append({"name": name, "ok": ok, "detail": detail[:500],
                           "ms": round((time.perf_counter() - t0) * 1000, 3)})
        if not ok and self.reason is None:
            self.reason = reason
        return ok


def static_checks(code: object, max_chars: int, ch: Checks) -> bool:
    t0 = time.perf_counter()
    if not isinstance(code, str) or not code.strip():
        return ch.add("code", False, "the design has no code", t0, "no_code")
    ch.add("code", True, f"{len(code)} characters", t0)
    t0 = time.perf_counter()
    if len(code) > max_chars:
        return ch.add("size", False, f"{len(code)} characters (cap {max_chars})", t0, "too_large")
    ch.add("size", True, f"<= {max_chars}", t0)
    t0 = time.perf_counter()
    try:
        with PARSE_LOCK:  # gh-106905: the sandbox compiles under the same lock
            tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        return ch.add("syntax", False, f"{type(exc).__name__}: {exc}", t0, "syntax_error")
    except (RecursionError, MemoryError) as exc:  # nested past the parser's limit: Python cannot run it either
        return ch.add("syntax", False, f"{type(exc).__name__}: nested too deeply to parse", t0, "syntax_error")
    ch.add("syntax", True, "parses", t0)
    t0 = time.perf_counter()
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    envish = [c.name for c in classes if any(
        (isinstance(b, ast.Name) and b.id.endswith("Env")) or (isinstance(b, ast.Attribute) and b.attr == "Env")
        for b in c.bases) or any(isinstance(f, ast.FunctionDef) and f.name == "step" for f in c.body)]
    if not envish:
        return ch.add("env_class", False, "no class derives from gymnasium.Env or defines step()", t0,
                      "no_env_class")
    return ch.add("env_class", True, ", ".join(envish), t0)


def _random_policy(seed: int) -> Callable[[int], str]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    return lambda t: "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))).strip()


def validate_design(design: Design, pool: SandboxPool, *, max_steps: int, seed: int,
                    trivial_return: float, duplicate: Duplicate | None = None, seeds_key: str = "") -> dict:
    """All checks for one design -> the fields of its validation row."""
    ch = Checks()
    stats: dict = {"warnings": []}
    detail, matched, key = duplicate or (None, None, None)
    if design.parse_error and not design.code:
        ch.add("code", False, f"parse error: {design.parse_error}", time.perf_counter(), "no_code")
        return {"valid": False, "reason": "no_code", "checks": ch.items, "stats": stats}
    if not static_checks(design.code, pool.config.max_code_chars, ch):
        return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
    if key:
        stats["ast_hash"] = key
    if not ch.add("duplicate", detail is None, detail or "new", time.perf_counter(), "duplicate"):
        stats["duplicate_of"] = matched  # a copy costs no sandbox time
        return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
    workers = []
    try:
        t0 = time.perf_counter()
        try:
            worker = pool.open(design.code, design.env_id, hash_seed=0)
            workers.append(worker)
        except EnvError as err:
            ch.add("import", False, err.detail, t0, err.reason)
            return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
        ch.add("import", True, f"class {worker.class_name}", t0)

        t0 = time.perf_counter()
        policies = {"scripted": lambda t: SCRIPTED[t % len(SCRIPTED)], "empty": lambda t: "",
                    "fixed": lambda t: FIXED, "random": _random_policy(seed + 3)}
        # Env seeds drawn as rollout draws them (a hash keyed by the input file, not 0, 1, 2...,
        # nor anything an env could compute), so that no seed tells the env it is being
        # validated; every episode runs in a fresh process, as in rollout.
        seeds = {name: episode_seed(seed, VALIDATION_ITERATION, design.env_id, i, seeds_key) for i, name in enumerate(policies)}
        episodes: dict[str, dict] = {}
        last = list(policies)[-1]  # its process stays open for gymnasium's checker
        # In sequence: --workers designs at once already fill the cores, and an episode costs CPU
        # (fork, copy-on-write faults, exit), not waiting, so parallel episodes would only queue.
        try:
            for name, policy in policies.items():
                episodes[name] = play(worker, name, seeds[name], policy, max_steps, keep=name == last)
        except EnvError as err:
            ch.add("contract", False, err.detail, t0, err.reason)
            return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
        steps = sum(e["steps"] for e in episodes.values())
        times = [x for e in episodes.values() for x in e["times"]]
        stats.update({"steps": steps, "returns": {k: round(v["return"], 6) for k, v in episodes.items()},
                      "step_ms_p50": round(statistics.median(times) * 1000, 4) if times else None})
        if not episodes["scripted"]["done"]:
            stats["warnings"].append(f"no termination within {max_steps} steps of the scripted policy")
        ch.add("contract", True, f"{len(episodes)} episodes, {steps} steps", t0)

        # gymnasium's checker builds, resets and steps an instance: in the last contract
        # episode's process once that episode is over, so no episode is played after it in a
        # process that could have seen it (module state, a reset count) and known it is validated.
        t0 = time.perf_counter()
        try:
            res = worker.check_env(after=last)
            stats["warnings"] += [f"gymnasium check_env: {w}" for w in res.get("warnings", [])]
            if res.get("error"):
                stats["warnings"].append(f"gymnasium check_env: {res['error']}")
            ch.add("gym_check_env", True, res.get("skipped") or res.get("error") or "passed", t0)
        except EnvError as err:  # advisory, even when it killed the process
            stats["warnings"].append(f"gymnasium check_env: {err.reason}: {err.detail}")
            ch.add("gym_check_env", True, f"advisory: {err.reason}", t0)

        t0 = time.perf_counter()
        bad = {k: e["return"] for k, e in episodes.items() if not return_in_range(e["return"])}
        if not ch.add("return_range", not bad, f"returns outside [0, 1]: {bad}" if bad else "all in [0, 1]",
                      t0, "return_out_of_range"):
            return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}

        # Determinism: the scripted episode again, in a process of the other zygote (another
        # PYTHONHASHSEED, its own import-time random state): clocks, urandom, unseeded random and
        # hash order all show up as a difference. (A second run in a process of the same zygote
        # would add nothing: no state crosses episodes, and that zygote's random state is shared.)
        t0 = time.perf_counter()
        try:
            other = pool.open(design.code, design.env_id, hash_seed=1)
            workers.append(other)
            again = play(other, "scripted", seeds["scripted"], policies["scripted"], max_steps)
        except EnvError as err:
            ch.add("determinism", False, f"in a second process: {err.reason}: {err.detail}", t0,
                   "nondeterministic")
            return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
        if again["digest"] != episodes["scripted"]["digest"]:
            ch.add("determinism", False, "a process with another PYTHONHASHSEED gave different results", t0,
                   "nondeterministic")
            return {"valid": False, "reason": ch.reason, "checks": ch.items, "stats": stats}
        ch.add("determinism", True, "a second process with another PYTHONHASHSEED agrees", t0)
    finally:
        for w in workers:
            w.close()

    t0 = time.perf_counter()
    hint = normalize(design.hint or "")
    leaked = [k for k, e in episodes.items() if any(hint_leaks(None, o, normalized_hint=hint) for o in e["obs"])]
    ch.add("hint_leak", not leaked, f"hint text appears in observations of: {', '.join(leaked)}" if leaked
           else "hint never observed", t0, "hint_leak")
    t0 = time.perf_counter()
    ch.add("no_hint", bool(hint), "has a hint" if hint else "the design has no hint", t0, "no_hint")
    t0 = time.perf_counter()
    easy = {k: episodes[k]["return"] for k in ("empty", "fixed", "random")
            if episodes[k]["return"] >= trivial_return}
    if easy and ch.reason is None:  # one lucky seed is not a trivial env: confirm on more seeds
        easy = validate_hacks.confirm_trivial(
            design, pool, easy, {"empty": lambda s: policies["empty"], "fixed": lambda s: policies["fixed"],
                                 "random": lambda s: _random_policy(s + 3)},
            lambda i: episode_seed(seed, VALIDATION_ITERATION, design.env_id, i, seeds_key),
            max_steps=max_steps, threshold=trivial_return)
    ch.add("trivial", not easy, f"degenerate policies reach a high return: {easy}" if easy
           else f"degenerate and random returns < {trivial_return} (or on one seed only)", t0, "trivial")
    single_shot = episodes["scripted"]["done"] and episodes["scripted"]["steps"] <= 1
    if ch.reason is None:  # probes cost episodes: only for designs that are valid so far
        hack_probes(design, pool, ch, stats, single_shot=single_shot, max_steps=max_steps,
                    seeds=(episode_seed(seed, VALIDATION_ITERATION, design.env_id, 10, seeds_key),
                           episode_seed(seed, VALIDATION_ITERATION, design.env_id, 11, seeds_key)),
                    trivial_return=trivial_return)
    if ch.reason is None:
        validate_hacks.answer_table(design, pool, ch, stats, {seeds[k]: e["obs"] for k, e in episodes.items()},
                                    single_shot=single_shot, max_steps=max_steps, threshold=trivial_return)
    if ch.reason is None and (design.gen or {}).get("backend") != "pool":  # the second duplicate key
        stats["behaviour"] = behaviour.play_fingerprint(
            pool, design.code, design.env_id, play, policies["scripted"],
            episode_seed(seed, VALIDATION_ITERATION, behaviour.VERSION, 0, seeds_key), max_steps)
    return {"valid": ch.reason is None, "reason": ch.reason, "checks": ch.items, "stats": stats}


def hack_probes(design: Design, pool: SandboxPool, ch: Checks, stats: dict, *, single_shot: bool,
                max_steps: int, seeds: tuple[int, int], trivial_return: float) -> None:
    """The ``hint_is_answer`` and ``format_only`` checks (spade_cli/checks/probes.py): each probe policy
    in a fresh process; a high return counts only when a second seed confirms it."""
    families = probes.policies(design.hint or "", single_shot)
    worker = None
    try:
        for reason, plays in families.items():
            t0 = time.perf_counter()
            fired, best = None, 0.0
            for name, replies in plays:
                if worker is None or not worker.alive:
                    worker = pool.open(design.code, design.env_id, hash_seed=0)
                policy = (lambda rs: lambda t: rs[t % len(rs)])(replies)
                ret = play(worker, name, seeds[0], policy, max_steps)["return"]
                best = max(best, ret)
                if ret >= trivial_return and play(worker, name + ":confirm", seeds[1], policy,
                                                  max_steps)["return"] >= trivial_return:
                    fired = name
                    break
            stats.setdefault("probes", {})[reason] = {"episodes": len(plays), "best_return": round(best, 6)}
            if not ch.add(reason, fired is None, f"{fired} reaches a high return on two seeds" if fired
                          else f"{len(plays)} probe episodes, best return {best:.3g}", t0, reason):
                return
    except EnvError as err:  # the contract says any text is a valid action; these are text too
        ch.add("hack_probes", False, f"{err.reason}: {err.detail}", time.perf_counter(), err.reason)
    finally:
        if worker is not None:
            worker.close()


# (detail, matched env_id, ast_hash) of one design: detail is None when the design is new.
Duplicate = tuple[str | None, str | None, str | None]
SAME = "same code up to names, constants and formatting as env"


def _memory_keys(memory: list[Memory], max_chars: int | None) -> tuple[dict[str, str], dict[str, str]]:
    """(ast_hash -> env_id, exact code key -> env_id) of the memory; a stored hash of the current
    normalisation is trusted, any other is recomputed from the row's code."""
    by_hash: dict[str, str] = {}
    by_code: dict[str, str] = {}
    for m in memory:
        code = m.extra.get("code")
        stored = m.extra.get("ast_hash")
        h = stored if astnorm.current(stored) else _hash(code, max_chars)
        if h:
            by_hash.setdefault(h, m.env_id)
        if isinstance(code, str) and code:
            by_code.setdefault(env_id_for(code, ""), m.env_id)
    return by_hash, by_code


def _hash(code: object, max_chars: int | None) -> str | None:
    if not isinstance(code, str) or (max_chars is not None and len(code) > max_chars):
        return None  # too_large says it; hashing megabytes first would be the cost of an attack
    return astnorm.ast_hash(code)


def duplicates(designs: list[Design], memory: list[Memory], max_chars: int | None = None) -> list[Duplicate]:
    """For each design, in input order: is it an env of the memory or of an earlier row?"""
    mem_hash, mem_code = _memory_keys(memory, max_chars)
    mem_ids = {m.env_id for m in memory}
    seen_hash: dict[str, tuple[int, str]] = {}
    seen_code: dict[str, tuple[int, str]] = {}
    out: list[Duplicate] = []
    for i, d in enumerate(designs):
        h = _hash(d.code, max_chars) if d.code else None
        code = env_id_for(d.code, "") if d.code else None
        pooled = (d.gen or {}).get("backend") == "pool"
        # A design-space env is its spec compiled: the same spec in a later iteration is the cell
        # chosen again (its history grows in the memory), and two cells share their structure by
        # construction. Only the same code twice in one input is a duplicate.
        spec = "spec" in d.extra
        found: tuple[str, str] | None = None
        if spec:
            pass
        elif d.env_id in mem_ids:
            found = (f"env_id {d.env_id} is already in memory", d.env_id)
        elif code in mem_code:
            found = (f"same code as env {mem_code[code]} in memory", mem_code[code])
        elif h in mem_hash and not pooled:
            found = (f"{SAME} {mem_hash[h]} in memory", mem_hash[h])
        if found is None and code in seen_code:
            row, eid = seen_code[code]
            found = (f"same code as env {eid} (input row {row + 1})", eid)
        elif found is None and h in seen_hash and not pooled and not spec:
            row, eid = seen_hash[h]
            found = (f"{SAME} {eid} (input row {row + 1})", eid)
        if code is not None:
            seen_code.setdefault(code, (i, d.env_id))
        if h is not None:
            seen_hash.setdefault(h, (i, d.env_id))
        out.append((*found, h) if found else (None, None, h))
    return out


def default_workers() -> int:
    """Two threads per usable core: each spends most of its time waiting on an env process."""
    return 2 * len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2 * (os.cpu_count() or 1)


def run(designs: str | Path | list, out: str | Path, *, memory: str | Path | None = None,
        workers: int | None = None,
        tier: str = "auto", min_tier: str = "process", max_steps: int = 16, seed: int = 0,
        trivial_return: float = 0.8, scratch_mb: int = 64, sandbox: SandboxConfig | None = None,
        force: bool = False,
        config: dict | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
    """Validate every design in ``designs`` into ``out``; returns the summary dict."""
    cfg = dict(config or {"memory": str(memory) if memory else None, "tier": tier, "min_tier": min_tier,
                          "max_env_steps": max_steps, "seed": seed, "trivial_return": trivial_return,
                          "scratch_mb": scratch_mb})
    inputs = {"designs": expand_inputs(designs)}
    if memory:
        inputs["memory"] = expand_inputs(memory)
    stage = Stage.begin("validate", out, cfg, inputs, force=force)
    if stage.check():
        return {"status": "up to date", "out": str(out)}
    rows = [rec for _, _, rec in read_rows(inputs["designs"], ("spade.design", "spade.validation"))]
    mem_rows = [rec for _, _, rec in read_rows(inputs["memory"], "spade.memory")] if memory else []
    done = stage.resume()
    if len(done) > len(rows):
        raise SpadeError(f"{stage.partial} has more rows than the input; pass --force")
    sb = sandbox or SandboxConfig(scratch_mb=scratch_mb)
    t0 = time.perf_counter()
    dups = duplicates(rows, mem_rows, sb.max_code_chars)
    stage.timings["duplicates_s"] = round(time.perf_counter() - t0, 3)
    sb.tier, sb.min_tier = tier, min_tier
    sb.preimport = tuple(sorted({*sb.preimport, *heavy_imports(r.code for r in rows[len(done):])}))
    t_start = time.perf_counter()
    try:
        pool = SandboxPool(sb)
        if len(done) < len(rows):
            pool.prestart((0, 1))  # the determinism check needs a second PYTHONHASHSEED
    except SandboxUnavailable as exc:
        raise SpadeError(str(exc)) from None
    counts = Counter(r.get("reason") for r in done)
    seeds_key = seed_key(map(seed_material, rows))  # seeds no env can compute

    def one(i: int) -> dict:
        fields = validate_design(rows[i], pool, max_steps=max_steps, seed=seed, trivial_return=trivial_return,
                                 duplicate=dups[i], seeds_key=seeds_key)
        return to_row(validation_from(rows[i], **fields))

    todo = range(len(done), len(rows))
    seen = behaviour.seen_in(done)  # behavioural fingerprints of the rows already written
    try:
        with pool, stage.writer() as writer, ThreadPoolExecutor(max(1, workers or default_workers())) as ex:
            for n, row in enumerate(ex.map(one, todo), 1):  # map keeps input order: the partial is a prefix
                row = behaviour.mark_duplicate(row, len(done) + n - 1, seen)
                writer.write(row)
                counts[row["reason"]] += 1
                if progress:
                    progress(len(done) + n, len(rows))
    except SandboxUnavailable as exc:
        raise SpadeError(f"sandbox failure (not an env verdict): {exc}") from None
    elapsed = time.perf_counter() - t_start
    stage.warnings = list(pool.warnings)
    stage.extra = {"sandbox": pool.describe()}
    stage.timings["validate_s"] = round(elapsed, 3)
    summary = {"status": "ok", "out": str(out), "rows": len(rows), "valid": counts.pop(None, 0),
               "invalid": dict(sorted(counts.items())), "resumed": len(done),
               "envs_per_s": round(len(todo) / elapsed, 2) if todo and elapsed > 0 else None,
               "tier": pool.tier, "warnings": pool.warnings}
    stage.commit(len(rows), summary)
    return summary
