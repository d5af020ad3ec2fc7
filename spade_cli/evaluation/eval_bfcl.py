"""`bfcl:` tasks: BFCL v4 multi-turn with the bfcl-eval package's own data, prompts and checker.

``bfcl:multi_turn[:N]`` runs the four multi-turn categories (``multi_turn_base``,
``multi_turn_long_context``, ``multi_turn_miss_func``, ``multi_turn_miss_param``, 200 entries
each); ``bfcl:multi_turn_base:N`` (or ``bfcl:base:N``) one of them, first N entries in BFCL's
id order. Everything BFCL-specific is imported from ``bfcl_eval`` rather than copied:

- the entries and possible answers (``load_dataset_entry`` / ``load_ground_truth_entry``);
- the conversation loop, system prompt (function docs in BFCL's prompting format), the
  held-out-function turns of ``miss_func``, the 20-step cap, the decoding of the model's
  ``[func(a=1)]`` text and the execution against BFCL's Python function backends (file system,
  trading, travel, ...): ``BaseHandler.inference_multi_turn_prompting``, driven by a handler
  whose only job is to turn BFCL's chat into one generate call on spade's backend;
- the verdict: ``multi_turn_checker`` (state and response checks after every turn), preceded by
  the same decoding and force-termination check as BFCL's ``eval_runner`` (that module is not
  imported because it pulls in every vendor SDK BFCL supports).

The model is prompted, not given native tools ("prompting" mode in BFCL's terms), so hf, vllm
and openai backends all see the same rendered chat. Output: one ``accuracy`` row per category,
plus ``OUT.bfcl/<spec>.jsonl`` with one line per entry (BFCL's result lists and the checker's
verdict). Each step waits on the previous step's tool output, so batching comes from running
entries side by side: with the openai backend (a server batches concurrent requests) up to
``--batch-size`` entries play at once in threads; hf and vllm play them one after another.

    spade eval --model ckpt --tasks bfcl:multi_turn --backend vllm --max-tokens 4096 --out e.jsonl
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from spade_cli.core.artifacts import SpadeError, write_jsonl
from spade_cli.core.records import Eval
from spade_cli.evaluation.eval_stats import mean_stderr

MULTI_TURN = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")
_THINK_END = "</think>"
BFCL_MAX_TOKENS = 1024  # a reply's cap without --max-tokens: one turn's calls


def categories(name: str) -> list[str]:
    """``multi_turn`` -> the four categories; ``base`` or ``multi_turn_base`` -> that one."""
    if name == "multi_turn":
        return list(MULTI_TURN)
    full = name if name.startswith("multi_turn_") else f"multi_turn_{name}"
    if full not in MULTI_TURN:
        raise SpadeError(f"bfcl:{name}: spade runs BFCL's multi-turn categories: multi_turn or one of "
                         f"{', '.join(MULTI_TURN)}")
    return [full]


def _import_bfcl(root: str | None = None) -> Any:
    # bfcl_eval keeps its lock files and results under BFCL_PROJECT_ROOT (default: site-packages),
    # read once at import: point it at spade's side folder before the first import.
    if root and "bfcl_eval" not in sys.modules:
        os.environ.setdefault("BFCL_PROJECT_ROOT", root)
    try:
        import bfcl_eval.model_handler.base_handler as base
        import bfcl_eval.model_handler.utils as mh_utils
        from bfcl_eval import utils
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    except ImportError as exc:
        raise SpadeError(f"bfcl: tasks need bfcl-eval, missing here ({exc}); install it without its "
                         "dependency list: pip install --no-deps 'bfcl-eval==2026.3.23' and then "
                         "pip install 'spade[bfcl]'") from None
    return base, mh_utils, utils, checker, multi_turn_utils


def make_handler(backend: Any, sampling: Any, run_name: str, seed: int) -> Any:
    """A BFCL prompting handler whose model call is one ``backend.generate`` on the rendered chat."""
    base, mh, _, _, _ = _import_bfcl()
    from spade_cli.backends import render_chat, sample_seed
    from spade_cli.backends.thinking import unanswered

    class SpadeHandler(base.BaseHandler):
        def __init__(self) -> None:
            super().__init__(model_name=run_name, temperature=sampling.temperature, registry_name=run_name,
                             is_fc_model=False)
            self.calls = 0

        def decode_ast(self, result: str, language: Any = None, has_tool_call_tag: bool = False) -> Any:
            return mh.default_decode_ast_prompting(result, language or mh.ReturnFormat.PYTHON, has_tool_call_tag)

        def decode_execute(self, result: str, has_tool_call_tag: bool = False) -> list[str]:
            return mh.default_decode_execute_prompting(result, has_tool_call_tag)

        def _query_prompting(self, inference_data: dict) -> tuple[Any, float]:
            ids = render_chat(backend.tokenizer, inference_data["message"])
            # One seed per call, derived from the run seed and the call's position in the entry,
            # so a resumed or reordered run samples what an uninterrupted one would.
            s = replace(sampling, seed=sample_seed(seed, self.calls))
            self.calls += 1
            t0 = time.perf_counter()
            [[sample]] = backend.generate([ids], n=1, sampling=s, seeds=[s.seed])
            return (sample, len(ids)), time.perf_counter() - t0

        def _pre_query_processing_prompting(self, test_entry: dict) -> dict:
            test_entry["question"][0] = mh.system_prompt_pre_processing_chat_model(
                test_entry["question"][0], test_entry["function"], test_entry["id"])
            return {"message": []}

        def _parse_query_response_prompting(self, api_response: Any) -> dict:
            sample, n_prompt = api_response
            # A thinking model's reasoning is logged but left out of the chat history and of the
            # text BFCL decodes, as BFCL's own handlers for reasoning models do.
            # A reply that never left its reasoning (--think-overflow end) answers nothing.
            reasoning, sep, answer = sample.text.rpartition(_THINK_END)
            if unanswered(sample):
                reasoning, sep, answer = sample.text, _THINK_END, ""
            out = {"model_responses": answer.strip() if sep else sample.text, "input_token": n_prompt,
                   "output_token": len(sample.token_ids)}
            if sep:
                out["reasoning_content"] = reasoning.replace("<think>", "").strip()
            return out

        def add_first_turn_message_prompting(self, inference_data: dict, first_turn_message: list) -> dict:
            inference_data["message"].extend(first_turn_message)
            return inference_data

        def _add_next_turn_user_message_prompting(self, inference_data: dict, user_message: list) -> dict:
            inference_data["message"].extend(user_message)
            return inference_data

        def _add_assistant_message_prompting(self, inference_data: dict, model_response_data: dict) -> dict:
            inference_data["message"].append({"role": "assistant",
                                              "content": model_response_data["model_responses"]})
            return inference_data

        def _add_execution_results_prompting(self, inference_data: dict, execution_results: list,
                                             model_response_data: dict) -> dict:
            inference_data["message"].append({"role": "user", "content": mh.format_execution_results_prompting(
                inference_data, execution_results, model_response_data)})
            return inference_data

    return SpadeHandler()


def check_entry(handler: Any, result: Any, entry: dict, truth: list[list[str]], category: str) -> dict:
    """BFCL's verdict on one entry: decode every step, then ``multi_turn_checker``.

    The decoding and the force-termination rule are eval_runner's ``_evaluate_single_multi_turn_entry``
    (undecodable or empty steps are dropped; a run that stopped early fails)."""
    _, _, _, checker, mt_utils = _import_bfcl()
    if not isinstance(result, list):
        return {"valid": False, "error_type": "multi_turn:inference_error"}
    if len(result) != len(truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(result)} turns answered of {len(truth)}"}
    decoded: list[list[list[str]]] = []
    for turn in result:
        steps = []
        for step in turn:
            try:
                calls = handler.decode_execute(step, has_tool_call_tag=False)
            except Exception:  # noqa: BLE001 - BFCL ignores a step it cannot decode (the model chatted)
                continue
            if not mt_utils.is_empty_execute_response(calls):
                steps.append(calls)
        decoded.append(steps)
    verdict = checker.multi_turn_checker(decoded, truth, copy.deepcopy(entry), category, handler.model_name)
    verdict["decoded"] = decoded
    return verdict


def _forget_instances(mt_utils: Any, run_name: str, entry_id: str) -> None:
    # BFCL keeps each entry's backend instances in its module globals under the model name and
    # the entry id, so a second sample of the same entry in this process would resume the first
    # one's file system. Only this entry's keys go: other entries may be running in other threads.
    prefix, tag = re.sub(r"[-./:]", "_", run_name), "_" + re.sub(r"[-./:]", "_", entry_id) + "_"
    for key in [k for k in list(vars(mt_utils)) if k.startswith(prefix) and tag in k]:
        vars(mt_utils).pop(key, None)


def play_entry(backend: Any, sampling: Any, entry: dict, truth: list[list[str]], category: str, *,
               run_name: str, seed: int, quiet: bool = True) -> dict:
    """One BFCL entry played by ``backend`` and judged by BFCL's checker: the per-item log line.

    BFCL prints every step to stdout, where spade keeps only its summary line: ``quiet`` sends it
    to /dev/null (a caller running entries in threads does that once around all of them)."""
    _, _, _, _, mt_utils = _import_bfcl()
    handler = make_handler(backend, sampling, run_name, seed=seed)
    try:
        with contextlib.ExitStack() as stack:
            if quiet:
                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
            result, meta = handler.inference(copy.deepcopy(entry), include_input_log=False, exclude_state_log=True)
            verdict = check_entry(handler, result, entry, truth, category)
    finally:
        _forget_instances(mt_utils, run_name, entry["id"])
    return {"id": entry["id"], "category": category, "valid": bool(verdict.pop("valid")), "verdict": verdict,
            "result": result, "ground_truth": truth, "reasoning_content": meta.get("reasoning_content")}


def run_bfcl(spec: Any, ctx: Any) -> list[Eval]:
    from spade_cli.backends import sample_seed

    side = ctx.side_dir("bfcl", spec)
    side.mkdir(parents=True, exist_ok=True)
    _, _, utils, _, _ = _import_bfcl(str(side))
    backend = ctx.replier(BFCL_MAX_TOKENS)
    sampling = ctx.sampling(BFCL_MAX_TOKENS)
    n = min(x for x in (spec.n, ctx.limit, 10**9) if x)
    rows, logs = [], []
    for category in categories(spec.name):
        entries = utils.load_dataset_entry(category)[:n]
        truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry(category)}
        jobs = [(entry, j, truths[entry["id"]], category) for entry in entries for j in range(ctx.samples)]

        def play(job: tuple[dict, int, list, str]) -> dict:
            entry, j, truth, cat = job
            log = play_entry(backend, sampling, entry, truth, cat, run_name=f"spade_{j}",
                             seed=sample_seed(f"{ctx.seed}|{entry['id']}", j), quiet=False)  # type: ignore[arg-type]
            return {**log, "sample": j}

        # A backend that takes concurrent calls (openai: a server batches them) plays entries in
        # threads, up to --batch-size at once; the others play them one after another.
        workers = ctx.batch_size if getattr(backend, "continuous", False) else 1
        scores = []
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), \
                ThreadPoolExecutor(max_workers=workers) as pool:
            for log in pool.map(play, jobs):
                logs.append(log)
                scores.append(1.0 if log["valid"] else 0.0)
                if len(scores) % 10 == 0 or len(scores) == len(jobs):
                    ctx.log(f"{spec.label}: {category} {len(scores)}/{len(jobs)}, "
                            f"accuracy {sum(scores) / len(scores):.3f}")
        value, stderr = mean_stderr(scores)
        rows.append(ctx.row(spec, "accuracy", value, "bfcl-eval", stderr=stderr, n=len(scores),
                            task=f"bfcl:{category}", samples=ctx.samples))
    write_jsonl(side.with_suffix(".jsonl"), logs)
    return rows
