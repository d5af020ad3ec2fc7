"""Reasoning budgets for the Designer and for eval: two-phase designs under both overflow policies
(a forced ``</think>`` masked in the Designer's update sample, an unfinished reasoning block an
invalid design with its reason), eval items whose reasoning runs out, and the flag refusals.

The scripted fake backend with the tiny model's real tokenizer writes the model's words, so the
token ids and masks are exact; one test plays a held-out suite in the real sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.backends.fake import FakeBackend
from spade_cli.core.records import parse
from spade_cli.designer import prompts
from stages import design
from tests.conftest import run_spade
from tests.test_backend_openai import serve  # noqa: F401  (the transformers serve fixture)

# A template that opens the reasoning block in the generation prompt (as Qwen3's thinking-only
# releases do): the reply starts inside the block and has no <think> of its own.
OPENING = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is not defined or enable_thinking %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)
LONG = "<think>\n" + "the env needs a reset and a step " * 8
ANSWER = ("Title: Guess the digit\n```python\nclass Guess:\n    def step(self, action):\n"
          "        return 'ok', 1.0, True, False, {}\n```\nHint: the digit is 5\n")
FORCED = "\n</think>\n\n"


def _fake(tiny_model: Path, outputs: list[str], template: str | None = None) -> FakeBackend:
    backend = FakeBackend(str(tiny_model), outputs=outputs)
    if template:
        backend.tokenizer.chat_template = template
    return backend


def _design(tmp_path: Path, backend: FakeBackend, **kw) -> tuple[dict, list]:
    out = tmp_path / "designs.jsonl"
    summary = design.run(out, backend=backend, n=2, group=2, grounding=False, example=False, seed=1, **kw)
    return summary, [parse(json.loads(line)) for line in out.read_text().splitlines()]


def _designer_samples(tmp_path: Path, rows: list) -> list:
    """The Designer's GRPO samples of these rows, rewarded 1 and 0 so the group has a spread."""
    from spade_cli.training.samples import collect_samples
    from stages.update import UpdateConfig

    scores = [{"schema": "spade.score/1", "env_id": r.env_id, "iteration": 0, "signal": "regret",
               "hinted_mean": 0.0, "unhinted_mean": 0.0, "hinted_n": 1, "unhinted_n": 1, "regret": 0.0,
               "regret_ci95": 0.0, "designer_reward": float(r.sample == 0), "group_id": r.group_id,
               "sample": r.sample} for r in rows]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
    cfg = UpdateConfig(model="m", envs=[str(tmp_path / "designs.jsonl")], scores=[str(tmp_path / "s.jsonl")],
                       temperature=1.0)
    samples, _ = collect_samples(cfg)
    return sorted(samples, key=lambda s: s.reward, reverse=True)


@pytest.mark.unit
def test_design_overflow_close_answers_after_a_forced_close_that_the_update_masks(tiny_model, tmp_path):
    backend = _fake(tiny_model, [LONG, LONG, ANSWER, ANSWER])
    summary, rows = _design(tmp_path, backend, thinking=True, think_tokens=6, answer_tokens=200,
                            think_overflow="close")
    tok = backend.tokenizer
    forced, answer = tok.encode(FORCED, add_special_tokens=False), tok.encode(ANSWER, add_special_tokens=False)
    assert summary["parse_errors"] == 0 and summary["think_overflows"] == 2 and backend.calls == 2
    assert [req[2].max_tokens for req in backend.requests] == [6, 200]
    for r in rows:
        assert r.code is not None and r.hint == "the digit is 5"
        assert r.gen["think_budget"] == {"think": 6, "answer": 200, "overflow": "close"}
        assert (r.gen["think_tokens"], r.gen["forced_tokens"], r.gen["answer_tokens"]) == (6, len(forced), len(answer))
        assert r.gen["think_overflow"] is True
        t = r.tokens
        assert t["completion_ids"] == tok.encode(LONG, add_special_tokens=False)[:6] + forced + answer
        assert t["env_mask"] == [1] * 6 + [0] * len(forced) + [1] * len(answer)
        assert [lp is None for lp in t["logprobs"]] == [m == 0 for m in t["env_mask"]]
    # the Designer trains on exactly the sampled tokens: the forced ones are masked, log-prob 0
    samples = _designer_samples(tmp_path, rows)
    assert len(samples) == 2
    for s, r in zip(samples, sorted(rows, key=lambda r: r.sample), strict=True):
        assert s.completion_ids == r.tokens["completion_ids"] and s.mask == r.tokens["env_mask"]
        assert s.prompt_ids == r.tokens["prompt_ids"]
        assert s.sampler_logps == [-1.0 if m else 0.0 for m in s.mask]


@pytest.mark.integration
def test_design_update_trains_the_sampled_tokens_of_two_phase_designs(tiny_model, tmp_path):
    """`spade update` on forced-close designs: the Designer's trained tokens are the sampled ones."""
    from stages import update
    from stages.update import UpdateConfig

    _, rows = _design(tmp_path, _fake(tiny_model, [LONG, LONG, ANSWER, ANSWER]), thinking=True,
                      think_tokens=6, answer_tokens=200)
    _designer_samples(tmp_path, rows)  # writes the scores
    out = tmp_path / "ckpt"
    summary = update.run(UpdateConfig(model=str(tiny_model), envs=[str(tmp_path / "designs.jsonl")],
                                      scores=[str(tmp_path / "s.jsonl")], out=str(out), learning_rate=1e-3,
                                      per_device_train_batch_size=2, max_grad_norm=0.0))
    assert summary["status"] == "ok" and summary["designer_samples"] == 2
    tokens = json.loads((out / "update.json").read_text())["roles"]["designer"]["tokens"]
    assert tokens["trained"] == sum(sum(r.tokens["env_mask"]) for r in rows)
    assert tokens["trained"] < sum(len(r.tokens["completion_ids"]) for r in rows)


@pytest.mark.unit
def test_design_overflow_end_is_an_invalid_design_with_its_reason(tiny_model, tmp_path):
    """The block opened by the prompt: one reply runs out of its budget, the other drafts a whole
    design and stops (EOS) without closing the block. Neither answered, so neither is a design,
    although the draft would parse as one."""
    tok = _fake(tiny_model, []).tokenizer
    draft = "draft it first:\n" + ANSWER
    budget = len(tok.encode(draft, add_special_tokens=False)) + 4
    backend = _fake(tiny_model, ["let me see " * budget, draft], template=OPENING)
    summary, rows = _design(tmp_path, backend, thinking=True, think_tokens=budget, answer_tokens=64,
                            think_overflow="end")
    assert backend.calls == 1  # no answer phase
    assert summary["parse_errors"] == 2 and summary["think_overflows"] == 2
    assert tok.decode(rows[0].tokens["prompt_ids"]).endswith("<think>\n")
    for r in rows:
        assert r.code is None and r.hint is None and r.env_id.startswith(design.FAILED_PREFIX)
        assert r.parse_error.startswith("think_overflow:") and "(end)" in r.parse_error
        assert r.gen["think_overflow"] is True and r.gen["answer_tokens"] == 0 and r.gen["forced_tokens"] == 0
        assert r.tokens["env_mask"] == [1] * len(r.tokens["completion_ids"])  # all sampled, all trained
    assert [r.gen["finish_reason"] for r in rows] == ["length", "stop"]
    assert prompts.parse_completion(rows[1].completion).code is not None  # what the rule refuses
    samples = _designer_samples(tmp_path, rows)
    assert [s.mask for s in samples] == [r.tokens["env_mask"] for r in rows]


@pytest.mark.unit
def test_design_one_budget_with_thinking_names_an_unclosed_block(tiny_model, tmp_path):
    _, rows = _design(tmp_path, _fake(tiny_model, ["<think>\n" + ANSWER]), thinking=True, max_tokens=400)
    assert all(r.parse_error.startswith("think_overflow:") and r.gen["think_overflow"] is True for r in rows)
    assert all("env_mask" not in r.tokens for r in rows)
    _, rows = _design(tmp_path, _fake(tiny_model, ["<think>\nhm\n</think>\n\n" + ANSWER]), thinking=True,
                      max_tokens=400, force=True)
    assert all(r.code is not None and r.gen["think_overflow"] is False for r in rows)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["hf", "openai"])
def test_design_two_phases_on_real_backends(name, tiny_model, tmp_path, request):
    """The tiny model through hf and through `transformers serve`: the prompt opens the block, the
    random reasoning runs out, spade closes it and the answer phase continues the same ids."""
    from spade_cli.backends import load_backend

    kwargs = {"base_url": request.getfixturevalue("serve") + "/v1"} if name == "openai" else {}
    backend = load_backend(name, str(tiny_model), **kwargs)
    backend.tokenizer.chat_template = OPENING
    try:
        summary, rows = _design(tmp_path, backend, thinking=True, think_tokens=4, answer_tokens=4)
    finally:
        backend.close()
    forced = backend.tokenizer.encode(FORCED, add_special_tokens=False)
    assert summary["think_overflows"] == 2
    for r in rows:
        n = r.gen["think_tokens"]
        assert r.gen["think_overflow"] is True and r.gen["forced_tokens"] == len(forced) and n >= 1
        ids, mask = r.tokens["completion_ids"], r.tokens["env_mask"]
        assert ids[n:n + len(forced)] == forced and mask == [1] * n + [0] * len(forced) + [1] * (len(ids) - n - len(forced))
        # text mode (transformers serve) re-tokenizes the returned text: a cut multi-byte character
        # comes back as U+FFFD, more tokens than were sampled (spade_cli/backends/openai.py)
        assert r.gen["answer_tokens"] >= 1 and (name == "openai" or r.gen["answer_tokens"] <= 4)
        lps = r.tokens["logprobs"]
        assert lps is None or [lp is None for lp in lps] == [m == 0 for m in mask]


@pytest.mark.integration
def test_design_cli_budgets_and_refusals(tiny_model, tmp_path):
    script = tmp_path / "outputs.json"
    script.write_text(json.dumps([LONG]))
    out = tmp_path / "d.jsonl"
    args = ["design", "--model", tiny_model, "--backend", "fake", "--n", "2", "--group", "2", "--no-grounding",
            "--think-tokens", "6", "--answer-tokens", "32", "--top-k", "20", "--out", out]
    proc = run_spade(*args, "--think-overflow", "end", env={"SPADE_FAKE_OUTPUTS": str(script)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["think_overflows"] == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # --think-tokens turns the template's thinking on unless --no-thinking says otherwise
    assert all(r["gen"]["enable_thinking"] is True and r["gen"]["top_k"] == 20 for r in rows)
    config = json.loads(Path(f"{out}.manifest.json").read_text())["config"]
    assert (config["think_tokens"], config["answer_tokens"], config["think_overflow"]) == (6, 32, "end")
    bad = run_spade(*args, "--think-overflow", "later", "--force")
    assert bad.returncode == 2 and "--think-overflow" in bad.stderr
    # a pool has no model: the budgets (like the sampling flags) do not apply and are no error
    pool = run_spade("design", "--pool", "starter", "--n", "2", "--think-tokens", "6", "--out", tmp_path / "p.jsonl")
    assert pool.returncode == 0, pool.stderr


# -- eval --------------------------------------------------------------------------------------

def _rg_ctx(tmp_path: Path, backend: FakeBackend, **kw):
    from spade_cli.evaluation.evaluators import EvalContext

    ctx = EvalContext(model="fake", out=tmp_path / "e.jsonl", batch_size=2, **kw)
    ctx._backend = backend
    return ctx


@pytest.mark.integration
def test_eval_rg_with_budgets_scores_the_answer_after_the_reasoning(tiny_model, tmp_path):
    pytest.importorskip("reasoning_gym")
    from spade_cli.evaluation.evaluators import parse_spec, rg_items, run_rg

    spec = parse_spec("rg:basic_arithmetic:2")
    golds = [item["answer"] for _, item, _ in rg_items(spec, 2, seed=0)[0]]
    answers = [f"<answer>{g}</answer>" for g in golds]
    backend = _fake(tiny_model, [LONG, LONG, *answers])
    [row] = run_rg(spec, _rg_ctx(tmp_path, backend, think_tokens=6, answer_tokens=40, think_overflow="close"))
    assert row.value == 1.0
    tok = backend.tokenizer
    (p1, _, s1), (p2, _, s2) = backend.requests
    assert (s1.max_tokens, s2.max_tokens) == (6, 40)
    assert p2[0] == p1[0] + tok.encode(LONG, add_special_tokens=False)[:6] + tok.encode(FORCED, add_special_tokens=False)
    logs = [json.loads(line) for line in Path(f"{tmp_path}/e.jsonl.rg/basic_arithmetic_2.jsonl").read_text().splitlines()]
    assert all(log["think_overflow"] is True and log["think_tokens"] == 6 and log["forced_tokens"] > 0 for log in logs)
    assert [log["extracted"] for log in logs] == golds

    # end: the block opened by the prompt never closes; the right answer inside it is no answer
    backend = _fake(tiny_model, answers, template=OPENING)
    [row] = run_rg(spec, _rg_ctx(tmp_path, backend, think_tokens=64, think_overflow="end", max_tokens=16))
    assert row.value == 0.0 and backend.calls == 1
    logs = [json.loads(line) for line in Path(f"{tmp_path}/e.jsonl.rg/basic_arithmetic_2.jsonl").read_text().splitlines()]
    assert all(log["extracted"] == "" and log["think_overflow"] is True for log in logs)


@pytest.mark.integration
def test_eval_bfcl_steps_are_the_answers_after_the_reasoning(tiny_model, tmp_path):
    pytest.importorskip("bfcl_eval")
    from bfcl_eval import utils

    from spade_cli.backends import Sampling
    from spade_cli.backends.thinking import Thinking, ThinkingBackend
    from spade_cli.evaluation.eval_bfcl import play_entry
    from tests.test_eval_suites import _replay

    entry = utils.load_dataset_entry("multi_turn_base")[1]
    truth = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry("multi_turn_base")}[entry["id"]]
    steps = _replay(truth)
    # close: every step reasons past its budget, then answers the right calls after </think>;
    # end: the prompt opens the block and the right calls come inside it, never closed: no answer
    for overflow, valid in (("close", True), ("end", False)):
        if overflow == "close":
            fake, budget = _fake(tiny_model, [x for step in steps for x in (LONG, step)]), 6
        else:
            fake, budget = _fake(tiny_model, steps, template=OPENING), 4096
        backend = ThinkingBackend(fake, Thinking(budget, 4096, overflow).bind(fake.tokenizer))
        log = play_entry(backend, Sampling(max_tokens=4096), entry, truth, "multi_turn_base",
                         run_name=f"spade_think_{overflow}", seed=0)
        assert log["valid"] is valid, log["verdict"]


@pytest.mark.integration
def test_eval_envs_suite_plays_with_budgets(tiny_model, tmp_path, monkeypatch):
    from spade_cli.evaluation.evaluators import parse_spec
    from stages import eval as stage
    from tests.test_eval import HALF

    suite = tmp_path / "heldout.jsonl"
    suite.write_text(json.dumps({"schema": "spade.validation/1", "code": HALF, "hint": "h", "valid": True}) + "\n")
    script = tmp_path / "outputs.json"
    script.write_text(json.dumps([LONG, LONG, "5", "5"]))  # both episodes in one call
    monkeypatch.setenv("SPADE_FAKE_OUTPUTS", str(script))
    out = tmp_path / "eval.jsonl"
    stage.run(str(tiny_model), [parse_spec(f"envs:{suite}")], out, backend="fake", k=1, max_turns=1,
              max_tokens=8, think_tokens=6, think_overflow="close")
    episodes = [json.loads(line) for line in Path(f"{out}.envs/heldout.rollouts.jsonl").read_text().splitlines()]
    assert len(episodes) == 2
    assert all(t["think_overflow"] is True and t["think_tokens"] == 6 and t["action"] == "5"
               for e in episodes for t in e["turns"])


@pytest.mark.integration
def test_eval_refuses_budgets_for_harness_tasks(tiny_model, tmp_path):
    from spade_cli.core.artifacts import SpadeError
    from spade_cli.evaluation.evaluators import check_thinking, parse_specs
    from stages import eval as stage

    proc = run_spade("eval", "--model", tiny_model, "--tasks", "rg:basic_arithmetic:2,lm:spade_tiny_qa",
                     "--think-tokens", "8", "--out", tmp_path / "e.jsonl")
    assert proc.returncode == 2 and "lm:spade_tiny_qa" in proc.stderr and "one phase" in proc.stderr
    assert not (tmp_path / "e.jsonl").exists()
    check_thinking(parse_specs("rg:a,envs:b,bfcl:multi_turn,tau2:airline"), 8)  # all spade-generated
    with pytest.raises(SpadeError, match="evalscope:acebench"):
        stage.run(str(tiny_model), parse_specs("evalscope:acebench"), tmp_path / "e.jsonl", think_tokens=8)
    with pytest.raises(SpadeError, match="think-overflow"):
        stage.run(str(tiny_model), parse_specs("rg:a"), tmp_path / "e.jsonl", think_overflow="later")


@pytest.mark.integration
def test_eval_tau2_agent_acts_on_the_answer_after_the_reasoning(tiny_model):
    pytest.importorskip("tau2")
    from spade_cli.backends import Sampling
    from spade_cli.backends.thinking import Thinking, ThinkingBackend
    from spade_cli.evaluation.eval_tau2 import _import_tau2, play_task
    from tests.test_eval_suites import _gold, _scripted_user

    task = {t.id: t for t in _import_tau2().load_tasks("airline", "base")}["2"]
    gold = _gold(task)
    # close: each reply reasons past its budget, then the gold action follows </think>; end: the
    # prompt opens the block and the gold actions come inside it, never closed: nothing is done
    for overflow, reward in (("close", 1.0), ("end", 0.0)):
        if overflow == "close":
            fake, budget = _fake(tiny_model, [x for step in gold for x in (LONG, step)]), 6
        else:
            fake, budget = _fake(tiny_model, gold, template=OPENING), 4096
        backend = ThinkingBackend(fake, Thinking(budget, 4096, overflow).bind(fake.tokenizer))
        server, _ = _scripted_user(["Hi, I need help with my reservation.", "Thanks, that's all. ###STOP###"])
        try:
            log = play_task(backend, Sampling(max_tokens=4096), "airline", task, user_model="scripted",
                            user_base_url=f"http://127.0.0.1:{server.server_port}/v1", max_steps=60, seed=0)
        finally:
            server.shutdown()
        assert log["reward"] == reward and log["error"] is None, log
        calls = [c for m in log["messages"] for c in (m.get("tool_calls") or [])]
        assert bool(calls) is (overflow == "close")


@pytest.mark.unit
def test_an_answer_may_quote_a_think_tag_once_the_reasoning_is_closed() -> None:
    from spade_cli.evaluation.eval_rg import extract_answer
    from stages.design import _unclosed

    reply = "<think>plan</think>\nOBS = 'reply with <think> notes'\n"
    assert not _unclosed(reply) and _unclosed("<think>still planning <think>")
    assert extract_answer("<think>r</think>the tag is <think>. <answer>7</answer>") == "7"
    assert extract_answer("<think>never closed") == ""
