"""The Designer's prompts of one iteration, before any model is involved.

``plan_prompts`` lays out the ``n / group`` prompt groups of a design run: each group picks a
document from the corpus (``spade_cli.designer.corpus``: hashed by document id, seed, iteration
and group, so the same seed gives the same documents on any machine), cuts its excerpt, and builds
the Designer's messages (``spade_cli.designer.prompts``) from the worked example, the excerpt and
the memory summary. ``spade design`` samples from these prompts; ``spade warmstart`` trains on them,
so the warm start sees exactly the prompts the loop's Designer will.

    plan = plan_prompts(24, 4, seed=0, iteration=3, corpus=None, grounding=True,
                        memory="runs/x/memory/iter_0003.jsonl", excerpt_chars=1500, worked=example)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from spade_cli.core.artifacts import read_records
from spade_cli.designer import corpus as corpus_mod
from spade_cli.designer import prompts


def group_id(seed: int, iteration: int, g: int) -> str:
    return f"i{iteration:04d}-g{g:03d}-" + hashlib.sha256(f"{seed}|{iteration}|{g}".encode()).hexdigest()[:8]


def plan_prompts(n: int, group: int, seed: int, iteration: int, corpus: str | None, grounding: bool,
                 memory: str | Path | None, excerpt_chars: int, memory_k: int = 12,
                 worked: dict | None = None, signal: str = "regret", contract: str = "full") -> list[dict]:
    """The ``n / group`` prompts of a run: ``{group_id, doc, messages}``, no model needed;
    ``worked`` is the worked example the prompt shows (``spade_cli.envs.pool.worked_example``),
    None for none."""
    docs = corpus_mod.load_corpus(corpus) if grounding else None
    mem = read_records(memory, expect="spade.memory") if memory else []
    memory_text = prompts.memory_summary(mem, k=memory_k)
    groups = n // group
    picks = corpus_mod.select_docs(docs, groups, seed, iteration) if docs else [None] * groups
    plan = []
    for g, d in enumerate(picks):
        doc = None
        if d is not None:
            text = corpus_mod.excerpt(d["text"], excerpt_chars, key=f"{d['id']}|{seed}|{iteration}|{g}")
            doc = {"id": d["id"], "source": d["source"], "text": text}
        messages = prompts.build_messages(worked, doc["text"] if doc else None, memory_text, signal=signal,
                                          contract=contract)
        plan.append({"group_id": group_id(seed, iteration, g), "doc": doc, "messages": messages})
    return plan
