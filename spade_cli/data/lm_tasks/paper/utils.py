"""Scoring helpers for spade's paper tasks (lm-eval ``!function`` targets).

AIME answers are matched with lm-eval's own AIME normaliser (``lm_eval.tasks.aime.utils``); the
score of an item is the mean over its ``repeats`` samples, which is pass@1 averaged over k
samples as the paper reports it. GPQA reuses lm-eval's GPQA choice shuffling. LiveCodeBench
programs run in spade's sandbox (``spade_cli.evaluation.lcb``).
"""

from __future__ import annotations

from lm_eval.tasks.aime.utils import is_equiv, last_boxed_only_string, remove_boxed
from lm_eval.tasks.gpqa.cot_zeroshot.utils import process_docs as gpqa_process_docs  # noqa: F401


def _boxed(response: str) -> str:
    response = response.rsplit("</think>", 1)[-1]  # a thinking model's scratch work is not its answer
    boxed = last_boxed_only_string(response)
    if boxed is None:
        return response.strip()
    try:
        return remove_boxed(boxed)
    except (AssertionError, IndexError):
        return response.strip()


def aime_results(doc: dict, results: list[str]) -> dict[str, float]:
    target = str(next(v for k, v in doc.items() if k.lower() == "answer"))
    hits = [1.0 if is_equiv(_boxed(r), target) else 0.0 for r in results]
    return {"exact_match": sum(hits) / len(hits)}


def lcb_docs(dataset):  # noqa: ANN001, ANN201 - a datasets.Dataset in and out
    from spade_cli.evaluation.lcb import prompt

    return dataset.map(lambda doc: {"spade_prompt": prompt(doc)})


def lcb_results(doc: dict, results: list[str]) -> dict[str, float]:
    from spade_cli.evaluation.lcb import score

    passed = [score(doc, r) for r in results]
    return {"pass@1": sum(passed) / len(passed)}
