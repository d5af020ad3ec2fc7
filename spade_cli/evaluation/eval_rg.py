"""`rg:` tasks: Reasoning Gym items through spade's own backends, scored by each dataset's own scorer.

``rg:<dataset>[:N]`` draws N items of one dataset with the run seed; ``rg:category:<name>[:N]``
draws them round-robin over every dataset Reasoning Gym files under that category (its
``ProceduralDataset.category``: the dataset's subpackage), plus ``math``, spade's reading of the
paper's RG-Math. The prompt is Reasoning Gym's default system prompt and the question, rendered
with the model's chat template; the answer is the last ``<answer>…</answer>`` after any
``</think>`` (else the last non-empty line; none when the block never closed), scored by
``score_answer``. With ``--think-tokens`` the reasoning and the answer have budgets of their own
(``spade_cli.backends.thinking``); the item log records each reply's reasoning figures. An item's score is the
mean over ``--samples`` samples; a category row also carries the mean per dataset. Per-item logs
go to ``OUT.rg/``.

    spade eval --model ckpt --tasks rg:category:math:200 --samples 1 --out e.jsonl
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spade_cli.core.artifacts import SpadeError, write_jsonl
from spade_cli.core.records import Eval
from spade_cli.evaluation.eval_stats import mean_stderr

if TYPE_CHECKING:  # annotations only: evaluators imports this module to dispatch rg: tasks
    from spade_cli.evaluation.evaluators import EvalContext, TaskSpec

# Room for a thinking model's reasoning before its <answer> (1024 cut most Qwen3 answers off).
RG_MAX_TOKENS = 8192

_THINK_END = "</think>"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def extract_answer(completion: str) -> str:
    """The last <answer>…</answer> after any reasoning block, else the last non-empty line; a
    reasoning block that is never closed leaves no answer."""
    if "<think>" in completion and _THINK_END not in completion.split("<think>", 1)[1]:  # the first opens it
        return ""
    text = completion.rsplit(_THINK_END, 1)[-1]
    found = _ANSWER.findall(text)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# Reasoning Gym has no "math" category; the paper's RG-Math is read here as its four math-flavoured
# categories together. Every other category name is Reasoning Gym's own.
RG_GROUPS = {"math": ("algebra", "arithmetic", "geometry", "probability")}


def rg_category(entry: Any) -> str:
    """A dataset's category exactly as ``ProceduralDataset.category`` derives it (its subpackage)."""
    cls = entry[0] if isinstance(entry, tuple) else entry
    parts = cls.__module__.split(".")
    return parts[1] if len(parts) >= 3 else "other"


def rg_datasets(name: str) -> list[str]:
    """A Reasoning Gym dataset name, or ``category:NAME`` (or a bare category): its datasets by name."""
    from reasoning_gym.factory import DATASETS

    if name in DATASETS:
        return [name]
    category = name.removeprefix("category:")
    wanted = RG_GROUPS.get(category, (category,))
    in_category = sorted(ds for ds, entry in DATASETS.items() if rg_category(entry) in wanted and ds != "composite")
    if not in_category:
        cats = sorted({rg_category(e) for e in DATASETS.values()} | set(RG_GROUPS))
        raise SpadeError(f"rg:{name}: not a Reasoning Gym dataset or category (categories: {', '.join(cats)})")
    return in_category


def rg_items(spec: TaskSpec, n: int, seed: int, log: Callable[[str], None] = lambda m: None,
             ) -> tuple[list[tuple[str, dict, Any]], dict[str, str]]:
    """(dataset name, item, dataset) for n items drawn round-robin over the spec's datasets, and
    the datasets of a category that could not be built here, with why (a single dataset that
    cannot be built is an error)."""
    import reasoning_gym

    names = rg_datasets(spec.name)
    per = -(-n // len(names))
    made, skipped = {}, {}
    for ds_name in names:
        try:
            made[ds_name] = reasoning_gym.create_dataset(ds_name, size=per, seed=seed)
        except Exception as exc:  # noqa: BLE001 - a dataset needing absent data is named, not hidden
            if len(names) == 1:
                raise SpadeError(f"rg:{spec.name}: cannot build Reasoning Gym dataset {ds_name!r}: {exc}") from None
            skipped[ds_name] = f"{type(exc).__name__}: {exc}"
            log(f"rg:{spec.name}: dataset {ds_name} left out: {skipped[ds_name]}")
    names = [ds for ds in names if ds in made]
    return [(names[i % len(names)], made[names[i % len(names)]][i // len(names)],
             made[names[i % len(names)]]) for i in range(n)], skipped


def _think_log(sample: Any) -> dict:
    """A reply's reasoning figures for the per-item log (two-phase replies only)."""
    keys = ("think_tokens", "answer_tokens", "forced_tokens", "think_overflow")
    return {k: sample.extra[k] for k in keys if k in (sample.extra or {})}


def run_rg(spec: TaskSpec, ctx: EvalContext) -> list[Eval]:
    """Item scores averaged over ``--samples`` samples; for a category, also the mean per dataset."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    from spade_cli.backends import render_chat
    from spade_cli.backends.thinking import unanswered

    n = spec.n or ctx.limit or 50
    if ctx.limit:
        n = min(n, ctx.limit)
    items, skipped = rg_items(spec, n, ctx.seed, ctx.log)
    backend = ctx.replier(RG_MAX_TOKENS)
    sampling = ctx.sampling(RG_MAX_TOKENS)
    logs, scores = [], []
    for start in range(0, len(items), ctx.batch_size):
        batch = items[start:start + ctx.batch_size]
        prompts = [render_chat(backend.tokenizer, [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                                                   {"role": "user", "content": item["question"]}])
                   for _, item, _ in batch]
        outs = backend.generate(prompts, n=ctx.samples, sampling=sampling)
        for (ds_name, item, ds), samples in zip(batch, outs, strict=True):
            per_sample = []
            for sample in samples:
                # A reply that never left its reasoning has no answer (its last line is a thought).
                answer = "" if unanswered(sample) else extract_answer(sample.text)
                try:
                    per_sample.append(float(ds.score_answer(answer, item)))
                except Exception:  # noqa: BLE001 - a scorer crashing on garbage text scores 0, as in rg
                    per_sample.append(0.0)
                logs.append({"dataset": ds_name, "question": item["question"], "gold": item["answer"],
                             "completion": sample.text, "extracted": answer, "score": per_sample[-1],
                             **_think_log(sample)})
            scores.append(sum(per_sample) / len(per_sample))
        ctx.log(f"{spec.label}: {len(scores)}/{n} items, mean score {sum(scores) / len(scores):.3f}")
    write_jsonl(ctx.side_dir("rg", spec).with_suffix(".jsonl"), logs)
    value, stderr = mean_stderr(scores)
    by_ds: dict[str, list[float]] = {}
    for (ds_name, _, _), score in zip(items, scores, strict=True):
        by_ds.setdefault(ds_name, []).append(score)
    extra: dict[str, Any] = {"datasets": sorted(by_ds), "samples": ctx.samples}
    if len(rg_datasets(spec.name)) > 1:
        extra["per_dataset"] = {ds: sum(v) / len(v) for ds, v in sorted(by_ds.items())}
        extra["skipped"] = skipped
    return [ctx.row(spec, "score", value, "reasoning-gym", stderr=stderr, n=len(scores), **extra)]
