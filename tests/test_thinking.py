"""Reasoning budgets and the reasoning context: two-phase replies, overflow policies, dropped
reasoning with exact per-turn training sequences, and the failed-episode rule in `spade update`.

The scripted fake backend (with the tiny model's real tokenizer) chooses the agent's words where a
test needs exact tokens; one test runs the real hf backend. The sandbox is the in-process stand-in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.backends import Sampling, render_chat
from spade_cli.backends.fake import FakeBackend
from spade_cli.backends.thinking import Thinking, answer_only, generate_thinking
from spade_cli.rollout.episodes import Engine, PlayConfig, episode_specs
from tests.test_rollout_engine import _envs
from tests.test_rollout_envs import GUESS, StandInError, StandInPool

# Qwen3's way with history, in the tiny model's tokens: an assistant turn that is not the last
# message loses its reasoning (everything up to </think>, then leading newlines).
DROPPING = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LONG = "<think>\n" + "let me see the digits one by one " * 8


def _fake(tiny_model: Path, outputs: list[str], template: str | None = None) -> FakeBackend:
    backend = FakeBackend(str(tiny_model), outputs=outputs)
    if template:
        backend.tokenizer.chat_template = template
    return backend


def _play(backend, k=1, **cfg):
    rows = []
    # One episode at a time: the scripted replies alternate phase 1 / phase 2 in call order.
    conf = {"max_turns": 2, "max_tokens": 64, "max_concurrent": 1, **cfg}
    Engine(backend, StandInPool(), _envs(GUESS), PlayConfig(**conf), rows.append,
           env_error=StandInError).run(episode_specs(list(_envs(GUESS)), k, run_seed=3, iteration=0))
    return rows


def _segments(row) -> list[list[int]]:
    """The runs of agent-turn tokens (sampled and forced) of a row, in order."""
    t = row.tokens
    return [t["completion_ids"][s["start"]:s["end"]] for s in t["turns"]] if "turns" in t else []


@pytest.mark.unit
def test_overflow_close_forces_the_end_of_reasoning_and_masks_it(tiny_model):
    backend = _fake(tiny_model, [LONG, "5"])
    rows = _play(backend, think_tokens=6, answer_tokens=8, think_overflow="close", think_context="drop")
    tok = backend.tokenizer
    forced = tok.encode("\n</think>\n\n", add_special_tokens=False)
    assert len(rows) == 2
    for r in rows:
        t = r.tokens
        for turn, seg, span in zip(r.turns, _segments(r), t["turns"], strict=True):
            assert turn["think_overflow"] is True and turn["think_tokens"] == 6 and turn["action"] == "5"
            assert turn["answer_tokens"] == len(tok.encode("5", add_special_tokens=False))
            assert seg == tok.encode(LONG, add_special_tokens=False)[:6] + forced + tok.encode("5")
            mask = t["env_mask"][span["start"]:span["end"]]
            lps = t["logprobs"][span["start"]:span["end"]]
            assert mask == [1] * 6 + [0] * len(forced) + [1] * (len(seg) - 6 - len(forced))
            assert all((lp is None) == (m == 0) for lp, m in zip(lps, mask, strict=True))
        assert r.extra["agent_tokens"] == sum(t["env_mask"])
    # phase 2 continued exactly the ids of phase 1 plus the forced ones
    (p1, _, s1), (p2, _, s2) = backend.requests[:2]
    assert s1.max_tokens == 6 and s2.max_tokens == 8
    assert p2[0] == p1[0] + tok.encode(LONG, add_special_tokens=False)[:6] + forced


@pytest.mark.unit
def test_overflow_end_sends_an_empty_action_and_says_so(tiny_model):
    backend = _fake(tiny_model, [LONG])
    rows = _play(backend, think_tokens=6, answer_tokens=8, think_overflow="end")
    assert backend.calls == sum(len(r.turns) for r in rows)  # no answer phase
    for r in rows:
        assert [t["action"] for t in r.turns] == ["", ""]
        assert all(t["think_overflow"] and t["think_tokens"] == 6 and t["answer_tokens"] == 0 for t in r.turns)
        assert all(r.tokens["env_mask"][i] for i in range(6))  # what was sampled is trained


@pytest.mark.unit
def test_one_budget_still_records_an_unclosed_block(tiny_model):
    rows = _play(_fake(tiny_model, [LONG]), max_tokens=6)
    assert all(t["think_overflow"] is True and t["action"] == "" for r in rows for t in r.turns)
    rows = _play(_fake(tiny_model, ["<think>\nhm\n</think>\n\n5"]), max_tokens=64)
    assert all(t["think_overflow"] is False and t["action"] == "5" for r in rows for t in r.turns)


@pytest.mark.unit
def test_dropped_reasoning_trains_each_turn_on_what_the_model_saw(tiny_model):
    from spade_cli.training.samples import _sequences

    backend = _fake(tiny_model, ["<think>\nreason A\n</think>", "\n\n5"], template=DROPPING)
    rows = _play(backend, max_turns=3, think_tokens=16, answer_tokens=8)  # auto: the template drops
    tok = backend.tokenizer
    phase1 = [req[0][0] for req in backend.requests[0::2]]  # one episode at a time: in order
    sampled = [req for req in backend.requests]
    assert len(sampled) == 2 * sum(len(r.turns) for r in rows)
    i = 0
    for r in rows:
        t = r.tokens
        assert t["think_context"] == "drop" and len(t["turns"]) == len(r.turns) == 3
        seqs = _sequences(Path("r.jsonl"), 1, t)
        for n, (prompt, completion, mask, lps, _start) in enumerate(seqs):
            assert prompt == phase1[i + n]  # the prompt is what the backend saw
            # ... and the chat re-rendered with earlier reasoning removed
            chat = r.messages[:2 + 2 * n]
            chat = [{**m, "content": answer_only(m["content"])} if m["role"] == "assistant" else m for m in chat]
            assert prompt == render_chat(tok, chat)
            assert completion == tok.encode("<think>\nreason A\n</think>\n\n5", add_special_tokens=False)
            assert mask == [1] * len(completion) and None not in lps
            assert ("reason A" in tok.decode(prompt)) is False
        i += len(seqs)
        # every agent token is in exactly one sequence; env tokens in none
        assert sum(len(s[1]) for s in seqs) == sum(t["env_mask"])


@pytest.mark.unit
def test_keep_and_drop_are_recorded(tiny_model):
    out = ["<think>\nreason B\n</think>\n\n5"]
    kept = _play(_fake(tiny_model, out))  # the tiny template keeps history verbatim: auto = keep
    assert all(r.tokens["think_context"] == "keep" and "turns" not in r.tokens for r in kept)
    forced_keep = _fake(tiny_model, out, template=DROPPING)
    kept = _play(forced_keep, think_context="keep")
    assert all(r.tokens["think_context"] == "keep" for r in kept)
    # keep: the second turn's context holds the first turn's reasoning
    assert "reason B" in forced_keep.tokenizer.decode(forced_keep.requests[1][0][0])
    dropping = _fake(tiny_model, out, template=DROPPING)
    dropped = _play(dropping, think_context="drop")
    assert all(r.tokens["think_context"] == "drop" for r in dropped)
    assert "reason B" not in dropping.tokenizer.decode(dropping.requests[1][0][0])
    # drop on a template that keeps history verbatim: spade removes the reasoning itself
    verbatim = _fake(tiny_model, out)
    dropped = _play(verbatim, think_context="drop")
    assert all(r.tokens["think_context"] == "drop" for r in dropped)
    assert "reason B" not in verbatim.tokenizer.decode(verbatim.requests[1][0][0])
    assert "reason B" in verbatim.tokenizer.decode(dropped[0].tokens["completion_ids"])  # still trained


@pytest.mark.integration
def test_two_phases_on_the_hf_backend_continue_the_same_ids(tiny_model):
    """The real model: a block opened by the prompt overflows, is closed by spade, and the answer
    is sampled after it; every sampled log-prob is the model's own at that position."""
    import torch

    from spade_cli.backends import load_backend

    hf = load_backend("hf", str(tiny_model))
    tok = hf.tokenizer
    prompt = render_chat(tok, [{"role": "user", "content": "Pick a digit."}]) + tok.encode("<think>\n")
    think = Thinking(think_tokens=5, answer_tokens=6, overflow="close").bind(tok)
    [[a]] = generate_thinking(hf, [prompt], 1, Sampling(temperature=1.0), think, seeds=[11])
    [[b]] = generate_thinking(hf, [prompt], 1, Sampling(temperature=1.0), think, seeds=[11])
    assert a.token_ids == b.token_ids  # seeded per prompt: reproducible
    mask = a.extra["sampled_mask"]
    assert a.extra["think_tokens"] == 5 and a.extra["think_overflow"]  # 5 random tokens never close it
    assert a.token_ids[5:5 + len(think.forced)] == list(think.forced)
    assert mask[5:5 + len(think.forced)] == [0] * len(think.forced)
    assert a.extra["answer_tokens"] <= 6 and sum(mask) == a.extra["think_tokens"] + a.extra["answer_tokens"]
    with torch.no_grad():
        ids = torch.tensor([prompt + a.token_ids])
        logits = hf.lm(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    own = logits.log_softmax(-1).gather(-1, torch.tensor(a.token_ids)[:, None])[:, 0].tolist()
    for m, lp, ref in zip(mask, a.logprobs, own, strict=True):
        assert (lp is None) == (m == 0)
        if m:
            assert abs(lp - ref) < 1e-4


# -- the failed-episode rule in the Agent's update --------------------------------------------

def _row(eid: str, env: str, ret: float, error: str | None, agent: int, **tokens) -> dict:
    comp = list(range(10, 10 + agent)) + [99]
    toks = {"prompt_ids": [1, 2, 3], "completion_ids": comp, "env_mask": [1] * agent + [0],
            "logprobs": [-1.0] * agent + [None], **tokens} if agent else {}
    return {"schema": "spade.rollout/1", "episode_id": eid, "env_id": env, "iteration": 0, "hinted": False,
            "seed": 0, "pair": 0, "messages": [], "turns": [], "return": ret, "terminated": True,
            "truncated": False, "error": error, "tokens": toks}


def _score(env: str, flags: list[str]) -> dict:
    return {"schema": "spade.score/1", "env_id": env, "iteration": 0, "signal": "regret", "hinted_mean": 0.0,
            "unhinted_mean": 0.0, "hinted_n": 3, "unhinted_n": 3, "regret": 0.0, "regret_ci95": 0.0,
            "designer_reward": 0.0, "flags": flags}


def _collect(tmp_path: Path, rows: list[dict], scores: list[dict]):
    from spade_cli.training.samples import collect_samples
    from stages.update import UpdateConfig

    for name, data in (("r.jsonl", rows), ("s.jsonl", scores)):
        (tmp_path / name).write_text("".join(json.dumps(x) + "\n" for x in data))
    cfg = UpdateConfig(model="m", rollouts=[str(tmp_path / "r.jsonl")], scores=[str(tmp_path / "s.jsonl")],
                       temperature=1.0)
    return collect_samples(cfg)


@pytest.mark.unit
def test_failed_episodes_train_as_zero_and_broken_envs_are_dropped(tmp_path):
    import torch

    from spade_cli.training import grpo

    rows = [_row("a1", "A", 1.0, None, 3), _row("a2", "A", 1.0, "step_timeout", 2),
            _row("a3", "A", 0.7, "crashed", 0),  # no agent tokens: no sample, but a 0 in the group
            _row("b1", "B", 1.0, None, 3), _row("b2", "B", 0.0, None, 3)]
    samples, counts = _collect(tmp_path, rows, [_score("A", []), _score("B", ["rollout_errors"])])
    agent = counts["agent"]
    assert agent["failed_reward0"] == 1 and agent["failed_no_tokens"] == 1
    assert agent["dropped_rollout_errors"] == 2 and "skipped_error" not in agent
    assert sorted(s.reward for s in samples) == [0.0, 1.0] and {s.group[1] for s in samples} == {"A"}
    adv, _ = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0]), ["A"] * 3)
    by_reward = {s.reward: s.advantage for s in samples}
    assert by_reward[1.0] == pytest.approx(float(adv[0])) and by_reward[0.0] == pytest.approx(float(adv[1]))
    failed = next(s for s in samples if s.reward == 0.0)
    assert failed.mask == [1, 1, 0]  # only what the agent generated before the failure


@pytest.mark.unit
def test_dropped_context_rows_give_one_sequence_per_turn_with_episode_advantages(tmp_path):
    import torch

    from spade_cli.core.artifacts import InputError
    from spade_cli.training import grpo

    # turn 0: prompt [1,2,3], reply [10,11]; env [90]; turn 1: prompt [1,2,3,50,90], reply [12]
    two = {"prompt_ids": [1, 2, 3], "completion_ids": [10, 11, 90, 12, 99], "env_mask": [1, 1, 0, 1, 0],
           "logprobs": [-1.0, -1.0, None, -1.0, None], "think_context": "drop",
           "turns": [{"prefix": 3, "ids": [], "start": 0, "end": 2}, {"prefix": 3, "ids": [50, 90], "start": 3,
                                                                       "end": 4}]}
    rows = [dict(_row("a1", "A", 1.0, None, 3), tokens=two), _row("a2", "A", 0.0, None, 3)]
    samples, counts = _collect(tmp_path, rows, [_score("A", [])])
    turns = sorted((s for s in samples if s.reward == 1.0), key=lambda s: len(s.prompt_ids))
    assert [(s.prompt_ids, s.completion_ids, s.mask) for s in turns] == [
        ([1, 2, 3], [10, 11], [1, 1]), ([1, 2, 3, 50, 90], [12], [1])]
    adv, _ = grpo.group_advantages(torch.tensor([1.0, 0.0]), ["A", "A"])  # by episode, not by sequence
    assert all(s.advantage == pytest.approx(float(adv[0])) for s in turns) and counts["agent"]["samples"] == 3
    bad = dict(two, turns=[{"prefix": 9, "ids": [], "start": 0, "end": 2}])
    with pytest.raises(InputError, match="turns"):
        _collect(tmp_path, [dict(rows[0], tokens=bad)], [_score("A", [])])
