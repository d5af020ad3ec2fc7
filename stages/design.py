"""`spade design`: the Designer writes environments, or a fixed pool stands in for it.

Inputs: a model (any backend), a corpus for grounding, the environment memory. Output: one
``spade.design/1`` row per sampled design (docs/architecture.md, 'Records'), ``n`` rows in ``n / group`` groups; the
``group`` samples of one group share a prompt and a ``group_id`` and form one GRPO group when the
Designer is updated.

For each group a document is picked from the corpus (``spade_cli.designer.corpus``: hash of the document id,
seed, iteration and group, so the same seed gives the same documents on any machine) and cut to an
excerpt; the prompt (``spade_cli.designer.prompts``) carries the environment contract, one worked example from
the bundled pool, the excerpt and a summary of the memory. All prompts go to the backend in one
batched call (``chunk`` splits it, trading throughput for finer resume points), with ``group``
samples each. Every completion becomes a row, parsed or not: a parse failure sets ``parse_error``
and leaves ``code``/``hint`` null, because the Designer must still be charged for it.

A thinking Designer can get budgets of its own for reasoning and for the answer (``think_tokens``,
``answer_tokens``, ``think_overflow``; ``spade_cli.backends.thinking``), generated in two phases
like the Agent's turns. A reply that never leaves its reasoning is a failed design with
``parse_error`` ``think_overflow: …``; a ``</think>`` that spade appended is 0 in ``tokens.env_mask``,
so the Designer's update trains only on sampled tokens.

With ``pool`` set no model is involved: rows come from a folder, a JSONL file of designs or
reasoning-gym tasks (``spade_cli.envs.pool``). That is the paper's fixed-pool baseline.

Compared with the paper this stage simplifies in two ways: the memory summary is a fixed text
block of the K most recent environments (no retrieval by similarity to the document), and a
document is excerpted by a hashed window rather than chunked by a tokenizer.

    spade design --model ckpt/iter_0003 --n 24 --group 4 --memory runs/x/memory.jsonl \\
        --iteration 3 --out runs/x/iter_0003/designs.jsonl
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from spade_cli.backends.thinking import Thinking, generate_thinking, unanswered
from spade_cli.core.artifacts import (
    InputError,
    SpadeError,
    atomic_write_text,
    dumps,
    later_defaults_dropped,
)
from spade_cli.core.errors import check_rows
from spade_cli.core.records import FAILED_PREFIX, Design, failed_design_id  # noqa: F401  (FAILED_PREFIX: re-exported)
from spade_cli.designer import corpus as corpus_mod
from spade_cli.designer import plan as prompt_plan
from spade_cli.designer import prompts
from spade_cli.envs import pool as pool_mod
from spade_cli.envs.pool import EXAMPLE_ENV, worked_example  # noqa: F401  (re-exported)


def _sub_seed(*parts: Any) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8], 16)


def plan_prompts(n: int, group: int, seed: int, iteration: int, corpus: str | None, grounding: bool,
                 memory: str | Path | None, excerpt_chars: int, memory_k: int = 12,
                 example: bool = True, signal: str = "regret", contract: str = "full") -> list[dict]:
    """The ``n / group`` prompts of a run (``spade_cli.designer.plan``), with the bundled worked
    example unless ``example`` is false."""
    return prompt_plan.plan_prompts(n, group, seed, iteration, corpus, grounding, memory, excerpt_chars, memory_k,
                                    pool_mod.worked_example() if example else None, signal, contract)


def _unclosed(text: str) -> bool:
    """One budget for reasoning and answer: the reasoning block (the reply's first ``<think>``) is
    never closed. An answer may quote ``<think>`` itself (an env about LLM text) once it is."""
    return "<think>" in text and "</think>" not in text.split("<think>", 1)[1]


def design_row(p: dict, j: int, sample: Any, prompt_ids: list[int], iteration: int, gen: dict,
               think: Thinking | None = None, contract: str = "full") -> Design:
    """One row per sample. A reply that never left its reasoning (``think_overflow``) is a failed
    design with that reason, whatever its reasoning text holds: code drafted while thinking is no
    answer. Tokens spade appended (a forced ``</think>``) are 0 in ``tokens.env_mask``."""
    parsed = prompts.parse_completion(sample.text, contract)
    extra = sample.extra or {}
    record = {k: extra[k] for k in ("think_tokens", "answer_tokens", "forced_tokens") if k in extra}
    if think is not None:
        overflow = bool(extra.get("think_overflow"))
        if unanswered(sample):
            parsed = prompts.Parsed(None, None, None, f"think_overflow: the reasoning used its budget "
                                    f"({record.get('think_tokens', think.think_tokens)} tokens) without "
                                    f"</think> ({think.overflow}); no answer")
    else:
        overflow = gen.get("enable_thinking", False) and _unclosed(sample.text or "")
        if overflow:
            parsed = prompts.Parsed(None, None, None, f"think_overflow: the reasoning block was not "
                                    f"closed within --max-tokens ({gen.get('max_tokens')}); no answer")
    if think is not None or gen.get("enable_thinking"):
        record["think_overflow"] = overflow
    failed = parsed.error is not None
    tokens = {"prompt_ids": prompt_ids, "completion_ids": list(sample.token_ids), "logprobs": sample.logprobs}
    if "sampled_mask" in extra:
        tokens["env_mask"] = list(extra["sampled_mask"])
    return Design(env_id=failed_design_id(p["group_id"], j, sample.text) if failed else "",
                  iteration=iteration, group_id=p["group_id"], sample=j, doc=p["doc"],
                  messages=p["messages"], completion=sample.text, title=parsed.title, code=parsed.code,
                  hint=parsed.hint, parse_error=parsed.error, tokens=tokens,
                  gen={**gen, **record, "finish_reason": sample.finish_reason},
                  extra={"spec": parsed.spec} if parsed.spec and not failed else {})


def _resume_groups(stage: Any, group: int) -> dict[str, list[dict]]:
    """Rows of groups a crashed run finished; a half-written group is dropped from the partial."""
    rows = stage.resume()
    by_group: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_group[r.get("group_id")].append(r)
    done = {gid: rs for gid, rs in by_group.items() if len(rs) == group}
    if sum(len(rs) for rs in done.values()) != len(rows):
        atomic_write_text(stage.partial, "".join(dumps(r) + "\n" for rs in done.values() for r in rs))
    return done


def run(out: str | Path, *, model: str | None = None, n: int = 24, group: int = 4,
        corpus: str | None = None, grounding: bool = True, memory: str | Path | None = None,
        iteration: int = 0, seed: int = 0, backend: Any = "hf", base_url: str | None = None,
        temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 4096, excerpt_chars: int = 1500,
        thinking: bool = True, pool: str | None = None, chunk: int = 0, memory_k: int = 12,
        example: bool = True, signal: str = "regret", top_k: int = 0, think_tokens: int | None = None,
        answer_tokens: int | None = None, think_overflow: str = "close", contract: str = "full",
        config: dict | None = None, force: bool = False, engine: Any = None,
        accept_foreign_server: bool = False) -> dict:
    """Write ``n`` design rows to ``out`` and return the summary (see the module docstring).

    ``backend`` is a registry name (hf, vllm, openai, ``module:Class``) or a ready backend object.
    ``memory`` is read when given; pass None for the no-memory ablation. ``think_tokens`` set:
    reasoning and answer get their own budgets (``spade_cli.backends.thinking``), the answer
    ``answer_tokens`` (default ``max_tokens``); a pool ignores them, as it ignores sampling.
    """
    from spade_cli.core.artifacts import Stage

    if n < 1 or group < 1 or (pool is None and n % group):
        raise ValueError(f"--n ({n}) must be a positive multiple of --group ({group})")
    check_rows(n, f"--n {n}", "designs", "lower it, and write more designs in several runs")
    if pool is None and not model and isinstance(backend, str):
        raise ValueError("pass --model (a Designer checkpoint) or --pool (a fixed environment pool)")
    if config is None:
        config = later_defaults_dropped({k: v for k, v in locals().items()
                                         if k not in ("out", "force", "Stage", "backend", "engine",
                                                      "accept_foreign_server")}, "design")
        config["backend"] = backend if isinstance(backend, str) else getattr(backend, "name", "custom")
    local = {"memory": memory}
    if pool and pool not in pool_mod.NAMED_POOLS and not pool.startswith("rg:"):
        local["pool"] = pool
    for role, path in local.items():
        if path is not None and not Path(path).exists():
            raise InputError(path, None, f"no such {role} file or folder")
    inputs: dict[str, list] = {}
    if memory:
        inputs["memory"] = [memory]
    if pool and not pool.startswith("rg:"):
        inputs["pool"] = [pool_mod.pool_path(pool)]
    if pool is None and grounding and (corpus is None or Path(corpus).exists()):
        inputs["corpus"] = [corpus or corpus_mod.BUNDLED]
    if pool is None and model and Path(model).exists():
        inputs["model"] = [model]
    stage = Stage.begin("design", out, config, inputs, force=force)
    if stage.check():
        return {"status": "up to date", "out": str(out)}

    if pool is not None:
        envs = pool_mod.load_pool(pool, n, seed, iteration)
        rows = pool_mod.pool_rows(envs, iteration, seed)
        stage.partial.unlink(missing_ok=True)  # a pool is rebuilt in a moment: no resume needed
        with stage.writer() as w:
            for r in rows:
                w.write(r)
        summary = {"status": "ok", "out": str(out), "rows": len(rows), "pool": pool,
                   "requested": n, "envs": len({r.env_id for r in rows}), "backend_calls": 0}
        stage.commit(len(rows), summary)
        return summary

    plan = plan_prompts(n, group, seed, iteration, corpus, grounding, memory, excerpt_chars, memory_k, example,
                        signal, contract)
    done = _resume_groups(stage, group)
    todo = [p for p in plan if p["group_id"] not in done]
    be = backend
    if isinstance(backend, str) and todo:  # nothing to generate after a crash past the last group
        from spade_cli.backends import load_backend

        kwargs = {"base_url": base_url} if base_url else {}
        if engine is not None and backend == "vllm":
            kwargs.update(engine.backend_kwargs())
            stage.extra["engine"] = engine.record()
        be = load_backend(backend, model, **kwargs)
    from spade_cli.backends import Sampling, preflight, render_chat, sampling_record

    checked: dict[str, Any] = {}
    if todo:
        try:
            checked = preflight(be, Sampling(temperature=temperature, top_p=top_p, top_k=top_k),
                                accept_foreign_server)
        except BaseException:
            if be is not backend and hasattr(be, "close"):
                be.close()
            raise
        stage.extra.update({k: v for k, v in checked.items() if k == "server"})
    think = None
    if think_tokens is not None and todo:
        think = Thinking(think_tokens, answer_tokens or max_tokens, think_overflow).bind(be.tokenizer)
    calls = prompt_tokens = completion_tokens = parse_errors = think_overflows = 0
    try:
        chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)] if chunk > 0 else [todo]
        with stage.writer() as w:
            for part in (c for c in chunks if c):
                ids = [render_chat(be.tokenizer, p["messages"], enable_thinking=thinking) for p in part]
                # One seed per group (prompt), so a group's designs do not depend on which other
                # groups share the call: a resumed run writes what the uninterrupted one would have.
                seeds = [_sub_seed(seed, iteration, p["group_id"]) for p in part]
                sampling = Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, top_k=top_k)
                if think is None:
                    outs = be.generate(ids, n=group, sampling=sampling, seeds=seeds)
                else:
                    outs = generate_thinking(be, ids, group, sampling, think, seeds=seeds)
                calls += 1
                gen = {"model": str(model) if model else getattr(be, "model", None),
                       **sampling_record(sampling, be), "max_tokens": max_tokens,
                       "enable_thinking": thinking}
                if think is not None:
                    gen["think_budget"] = {"think": think.think_tokens, "answer": think.answer_tokens,
                                           "overflow": think.overflow}
                if len(outs) != len(part) or any(len(o) != group for o in outs):
                    raise SpadeError(f"backend {be.name} returned {[len(o) for o in outs]} samples for "
                                     f"{len(part)} prompts x {group}")
                for p, pid, samples, group_seed in zip(part, ids, outs, seeds, strict=True):
                    for j, s in enumerate(samples):
                        row = design_row(p, j, s, pid, iteration, {**gen, "seed": group_seed}, think,
                                         contract)
                        parse_errors += row.parse_error is not None
                        think_overflows += bool((row.gen or {}).get("think_overflow"))
                        prompt_tokens += len(pid)
                        completion_tokens += len(s.token_ids)
                        w.write(row)
    finally:
        if be is not backend and hasattr(be, "close"):
            be.close()
    resumed = sum(len(rs) for rs in done.values())
    parse_errors += sum(r.get("parse_error") is not None for rs in done.values() for r in rs)
    think_overflows += sum(bool((r.get("gen") or {}).get("think_overflow")) for rs in done.values() for r in rs)
    rows = resumed + sum(group for _ in todo)
    summary = {"status": "ok", "out": str(out), "rows": rows, "groups": len(plan), "group": group,
               "backend_calls": calls, "resumed_rows": resumed, "parse_errors": parse_errors,
               "parsed": rows - parse_errors, "prompt_tokens": prompt_tokens,
               "completion_tokens": completion_tokens, "think_overflows": think_overflows,
               "grounding": grounding, "logprobs": checked.get("logprobs"),
               "memory": str(memory) if memory else None,
               "doc_ids": [p["doc"]["id"] if p["doc"] else None for p in plan]}
    stage.commit(rows, summary)
    return summary
