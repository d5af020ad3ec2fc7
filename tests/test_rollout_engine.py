"""The episode engine: seeds and pairing, token alignment, masking, errors, replay, quarantine.

The model is the real tiny checkpoint through the real hf backend (or the scripted fake backend
when a test needs to choose the agent's words); the sandbox is the in-process stand-in from
``test_rollout_envs`` so these tests isolate the engine. ``test_rollout_cli.py`` runs the real sandbox.
"""

from __future__ import annotations

import time

import pytest

from spade_cli.core.records import env_id_for
from spade_cli.rollout.episodes import Engine, EnvSource, PlayConfig, episode_specs, to_action
from tests.test_rollout_envs import CRASHER, GUESS, HINT, RAISER, StandInError, StandInPool

NEVER = GUESS.replace("int(self.np_random.integers(0, 10))", "10 + int(self.np_random.integers(0, 10))")
BOOM = GUESS.replace("        self.t += 1\n", "        self.t += 1\n        if 'boom' in action:\n"
                     "            raise SystemExit(3)\n", 1)


def _envs(*codes: str) -> dict[str, EnvSource]:
    return {env_id_for(c, HINT): EnvSource(env_id_for(c, HINT), c, HINT) for c in codes}


def _play(backend, envs, k=2, batching="lockstep", pool=None, **cfg):
    rows, pool = [], pool or StandInPool()
    engine = Engine(backend, pool, envs, PlayConfig(**{"max_turns": 3, "max_tokens": 16, **cfg}),
                    rows.append, env_error=StandInError, batching=batching)
    stats = engine.run(episode_specs(list(envs), k, run_seed=7, iteration=2))
    return rows, stats, pool


@pytest.fixture(scope="module")
def hf(tiny_model):
    from spade_cli.backends import load_backend

    return load_backend("hf", str(tiny_model))


@pytest.mark.unit
def test_specs_pair_hinted_and_unhinted_on_the_same_seeds():
    specs = episode_specs(["e1", "e2"], 3, run_seed=1, iteration=4)
    assert len(specs) == 12 and len({s.episode_id for s in specs}) == 12
    for env in ("e1", "e2"):
        for pair in range(3):
            a, b = (s for s in specs if s.env_id == env and s.pair == pair)
            assert a.seed == b.seed and {a.hinted, b.hinted} == {False, True}
    assert len({s.seed for s in specs}) == 6
    assert specs == episode_specs(["e1", "e2"], 3, run_seed=1, iteration=4)  # deterministic
    other = episode_specs(["e1", "e2"], 3, run_seed=2, iteration=4)
    assert not {s.seed for s in specs} & {s.seed for s in other}


@pytest.mark.unit
def test_action_strips_think_and_truncates():
    assert to_action("<think>I guess 3</think>\n 5 ", 100) == "5"
    assert to_action("<think>never closed 7", 100) == ""
    assert to_action("abcdef", 3) == "abc"


@pytest.mark.integration
def test_tokens_align_with_the_rendered_chat_and_the_hint_stays_out(hf):
    envs = _envs(GUESS)
    calls = hf.calls
    rows, stats, pool = _play(hf, envs, k=2, max_turns=3, max_tokens=12)
    tok = hf.tokenizer
    # one generate call per turn for all active episodes
    assert len(rows) == 4 and hf.calls - calls == stats.ticks == max(len(r.turns) for r in rows)
    assert sorted((r.pair, r.hinted) for r in rows) == [(0, False), (0, True), (1, False), (1, True)]
    for r in rows:
        t = r.tokens
        assert len(t["completion_ids"]) == len(t["env_mask"]) == len(t["logprobs"])
        full = tok.decode(t["prompt_ids"] + t["completion_ids"], skip_special_tokens=False)
        assert full == tok.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=False)
        assert t["prompt_ids"] == tok.apply_chat_template(r.messages[:2], tokenize=True,
                                                          add_generation_prompt=True)["input_ids"]
        assert all((lp is None) == (m == 0) for lp, m in zip(t["logprobs"], t["env_mask"], strict=True))
        agent = [i for i, m in zip(t["completion_ids"], t["env_mask"], strict=True) if m]
        assert r.extra["agent_tokens"] == len(agent) > 0
        # every agent segment decodes to an assistant message (plus its EOS when it stopped)
        replies = "".join(m["content"] for m in r.messages if m["role"] == "assistant")
        assert tok.decode(agent, skip_special_tokens=True) == tok.decode(tok.encode(replies), skip_special_tokens=True)
        # reply_ends cut the stream into the replies, one per assistant message (turn credit uses it)
        ends, said = t["reply_ends"], [m["content"] for m in r.messages if m["role"] == "assistant"]
        assert len(ends) == len(said) and not any(t["env_mask"][ends[-1]:])
        for a, b, text in zip([0, *ends], ends, said, strict=False):
            span = [i for i, m in zip(t["completion_ids"][a:b], t["env_mask"][a:b], strict=True) if m]
            assert tok.decode(span, skip_special_tokens=True) == tok.decode(tok.encode(text), skip_special_tokens=True)
        # env tokens hold the observations that were fed back
        env_text = tok.decode([i for i, m in zip(t["completion_ids"], t["env_mask"], strict=True) if not m])
        for turn in r.turns[:-1]:
            assert turn["observation"] in env_text
        assert r.error is None and (r.terminated or (r.truncated and len(r.turns) == 3))
        assert r.return_ == sum(t["reward"] for t in r.turns)
        assert (HINT in full) is r.hinted and (HINT in str(r.messages)) is r.hinted
    seeds = {(r.pair, r.hinted): r.seed for r in rows}
    assert seeds[(0, False)] == seeds[(0, True)] != seeds[(1, False)] == seeds[(1, True)]
    # the same seed gives the same first observation with and without the hint
    first = {(r.pair, r.hinted): r.messages[1]["content"] for r in rows}
    assert first[(0, False)] == first[(0, True)] and first[(1, False)] == first[(1, True)]


@pytest.mark.integration
def test_context_budget_truncates_and_is_never_exceeded(hf):
    envs = _envs(NEVER)  # unsolvable: only the budget can end these episodes
    probe, _, _ = _play(hf, envs, k=1, max_turns=1, max_tokens=4)
    budget = max(len(r.tokens["prompt_ids"]) for r in probe) + 40
    rows, _, _ = _play(hf, envs, k=1, max_turns=50, max_tokens=16, max_episode_tokens=budget)
    tight, _, _ = _play(hf, envs, k=1, max_episode_tokens=budget - 45)  # the hinted prompt alone is too long
    hinted = next(r for r in tight if r.hinted)
    assert hinted.turns == [] and hinted.tokens["completion_ids"] == [] and hinted.truncated
    for r in rows:
        n = len(r.tokens["prompt_ids"]) + len(r.tokens["completion_ids"])
        assert n <= budget + 2  # + the closing env tokens of the last reply
        assert r.truncated and r.extra["stop"] == "max_episode_tokens" and len(r.turns) < 50


@pytest.mark.integration
def test_crash_at_turn_two_ends_the_episode_and_quarantines_the_env(hf):
    envs = _envs(GUESS, CRASHER, RAISER)
    rows, stats, pool = _play(hf, envs, k=3, max_turns=4, quarantine_after=3, error_return=-0.5)
    by_env = {e: [r for r in rows if r.env_id == e] for e in envs}
    assert len(rows) == 18
    good, crash, raiser = (by_env[env_id_for(c, HINT)] for c in (GUESS, CRASHER, RAISER))
    assert all(r.error is None and 0 <= r.return_ <= 1 for r in good)
    assert all(r.error == "crashed" and r.return_ == -0.5 for r in crash)
    assert all(len(r.turns) == 1 for r in crash if r.extra["stop"] == "error")  # turn 1 ok, died at 2
    assert all(r.error == "step_exception" for r in raiser)
    assert set(stats.quarantined) == {env_id_for(CRASHER, HINT), env_id_for(RAISER, HINT)}
    assert stats.errors["crashed"] == 6


@pytest.mark.integration
def test_a_dying_worker_is_replaced_and_its_other_episodes_replayed(tiny_model):
    from spade_cli.backends.fake import FakeBackend

    envs = _envs(BOOM)
    # tick 1: episode 0 says boom (kills the shared worker), episode 1 says 4; then plain guesses
    backend = FakeBackend(str(tiny_model), outputs=["boom", "4", "5", "6", "7", "8"])
    rows, stats, pool = _play(backend, envs, k=1, max_turns=3, quarantine_after=3)
    assert len(pool.opened) == 2  # the replacement worker
    dead, alive = sorted(rows, key=lambda r: r.error is None)
    assert dead.error == "crashed" and dead.turns == []
    assert alive.error is None and [t["action"] for t in alive.turns][:1] == ["4"]
    assert len(alive.turns) >= 2 and not stats.quarantined
    # the replay reset the survivor on the new worker with its own seed
    assert pool.resets.count((alive.episode_id, alive.seed)) == 2


@pytest.mark.integration
def test_an_observation_that_leaks_the_hint_ends_the_episode(tiny_model):
    from spade_cli.backends.fake import FakeBackend

    leak = GUESS.replace('return "correct"', 'return "correct"').replace(
        'f"wrong, try {hint} (turn {self.t})"', f'"wrong. {HINT}"')
    rows, stats, _ = _play(FakeBackend(str(tiny_model), outputs=["x"]), _envs(leak), k=1, quarantine_after=9)
    assert [r.error for r in rows] == ["hint_leak", "hint_leak"]
    unhinted = next(r for r in rows if not r.hinted)
    assert HINT not in str(unhinted.messages) + str(unhinted.turns)  # nor the record


@pytest.mark.integration
def test_a_return_outside_zero_one_is_an_error(tiny_model):
    from spade_cli.backends.fake import FakeBackend

    greedy = GUESS.replace('return "correct", 1.0, True', 'return "correct", 1.0, True').replace(
        'return f"wrong, try {hint} (turn {self.t})", 0.0, False, self.t >= 6, {}',
        'return "wrong", 0.75, False, False, {}')
    rows, _, _ = _play(FakeBackend(str(tiny_model), outputs=["x"]), _envs(greedy), k=1, max_turns=2,
                       quarantine_after=9, error_return=0.0)
    assert all(r.error == "return_out_of_range" and r.return_ == 0.0 and len(r.turns) == 2 for r in rows)
    assert all(sum(t["reward"] for t in r.turns) == 1.5 for r in rows)


# A Qwen3-like template: earlier assistant turns lose their <think> block when the chat grows.
REWRITES = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and not loop.last and '</think>' in m.content %}"
    "{{- '<|im_start|>assistant\\n' + m.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.integration
def test_a_template_that_rewrites_history_is_spliced_turn_by_turn(tiny_model):
    from spade_cli.backends.fake import FakeBackend

    backend = FakeBackend(str(tiny_model), outputs=["<think>try</think>3"])
    backend.tokenizer.chat_template = REWRITES
    tok = backend.tokenizer
    rows, _, _ = _play(backend, _envs(NEVER), k=1, max_turns=3)
    assert len(rows) == 2
    for r in rows:
        assert r.error is None and len(r.turns) == 3 and r.extra["splicing"] == "per_turn"
        t = r.tokens
        # The stream is what the model saw: every reply verbatim, think block included, and each
        # observation as a new user turn — not the template's rewritten final chat.
        expected = tok.apply_chat_template(r.messages[:2], tokenize=False, add_generation_prompt=True)
        for m in r.messages[2:]:
            if m["role"] == "assistant":
                expected += m["content"] + "<|im_end|>\n"
            else:
                expected += "<|im_start|>user\n" + m["content"] + "<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(t["prompt_ids"] + t["completion_ids"]) == expected
        assert expected != tok.apply_chat_template(r.messages, tokenize=False)
        agent = [i for i, m in zip(t["completion_ids"], t["env_mask"], strict=True) if m]
        assert tok.decode(agent).count("<think>try</think>3") == 3
        assert all((lp is None) == (m == 0) for lp, m in zip(t["logprobs"], t["env_mask"], strict=True))


@pytest.mark.integration
def test_an_append_only_template_keeps_rendered_splicing(hf):
    rows, _, _ = _play(hf, _envs(GUESS), k=1, max_turns=2, max_tokens=8)
    assert {r.extra["splicing"] for r in rows} == {"rendered"}


# -- continuous batching: each episode advances on its own -------------------------------------

def _guess(seed: int) -> str:
    """A reply that depends on the seed only, so thread scheduling cannot change what is sampled."""
    return f"<think>t{seed % 7}</think>{seed % 10}"


def _fake(tiny_model, **kw):
    from spade_cli.backends.fake import FakeBackend

    return FakeBackend(str(tiny_model), **{"reply": _guess, **kw})


def _key(r) -> tuple:
    return (r.tokens, r.turns, r.return_, r.messages, r.error, r.extra["stop"], r.terminated, r.truncated)


@pytest.mark.integration
def test_continuous_batching_gives_the_rows_of_lockstep(tiny_model):
    envs = _envs(GUESS, NEVER)
    lock_rows, lock_stats, _ = _play(_fake(tiny_model), envs, k=3, max_turns=5)
    backend = _fake(tiny_model, delay=0.002)
    rows, stats, _ = _play(backend, envs, k=3, max_turns=5, batching="continuous", max_concurrent=5)
    assert len(rows) == len(lock_rows) == 12
    lock = {r.episode_id: _key(r) for r in lock_rows}
    assert {r.episode_id: _key(r) for r in rows} == lock
    assert any(r.terminated for r in rows) and any(len(r.turns) == 5 for r in rows)  # both kinds of end
    # one call per episode-turn instead of one per tick
    assert stats.calls == backend.calls == sum(len(r.turns) for r in rows) > lock_stats.calls
    assert stats.turns == lock_stats.turns and stats.gen_tokens == lock_stats.gen_tokens
    assert stats.done == stats.total == 12 and 0 < stats.gen_s and 0 < stats.env_s


@pytest.mark.integration
def test_continuous_batching_never_exceeds_max_concurrent(tiny_model):
    backend = _fake(tiny_model, delay=0.01, rendezvous=3)  # calls wait until three overlap
    rows, _, _ = _play(backend, _envs(NEVER, GUESS), k=4, max_turns=3, batching="continuous", max_concurrent=3)
    assert len(rows) == 16 and all(r.error is None for r in rows)
    assert backend.max_in_flight == 3  # reached, never passed


@pytest.mark.integration
def test_crash_at_turn_two_and_quarantine_under_continuous_batching(tiny_model):
    envs = _envs(GUESS, CRASHER, RAISER)
    rows, stats, _ = _play(_fake(tiny_model, delay=0.002), envs, k=3, max_turns=4, quarantine_after=3,
                           error_return=-0.5, batching="continuous", max_concurrent=4)
    by_env = {e: [r for r in rows if r.env_id == e] for e in envs}
    assert len(rows) == 18 and len({r.episode_id for r in rows}) == 18
    good, crash, raiser = (by_env[env_id_for(c, HINT)] for c in (GUESS, CRASHER, RAISER))
    assert all(r.error is None and 0 <= r.return_ <= 1 for r in good)
    assert all(r.error == "crashed" and r.return_ == -0.5 for r in crash)
    assert all(len(r.turns) == 1 for r in crash if r.extra["stop"] == "error")  # turn 1 ok, died at 2
    assert 3 <= sum(r.extra["stop"] == "error" for r in crash)  # quarantine came after three errors
    assert all(r.error == "step_exception" for r in raiser)
    assert set(stats.quarantined) == {env_id_for(CRASHER, HINT), env_id_for(RAISER, HINT)}
    assert stats.errors["crashed"] == 6 and stats.done == 18
    for r in rows:  # quarantined rows too: tokens stay aligned with what the model saw
        t = r.tokens
        assert len(t["completion_ids"]) == len(t["env_mask"]) == len(t["logprobs"])


@pytest.mark.integration
@pytest.mark.parametrize("batching", ["lockstep", "continuous"])
def test_an_episode_that_stepped_before_its_worker_died_is_replayed(tiny_model, batching):
    from spade_cli.rollout.episodes import turn_seed

    never_boom = BOOM.replace("int(self.np_random.integers(0, 10))", "10 + int(self.np_random.integers(0, 10))")
    envs = _envs(never_boom)
    specs = episode_specs(list(envs), 1, run_seed=7, iteration=2)
    survivor, killer = specs  # lockstep steps the survivor first, then the killer kills the worker
    says = {turn_seed(survivor.episode_id, t): str(t + 1) for t in range(3)}
    says[turn_seed(killer.episode_id, 0)] = "boom"
    pool = StandInPool()

    def reply(seed: int) -> str:
        # The survivor's second reply waits until the killer's step is under way, so under
        # continuous batching too the survivor has stepped once on the worker that then dies.
        if seed == turn_seed(survivor.episode_id, 1):
            deadline = time.monotonic() + 10
            while (killer.episode_id, "boom") not in pool.steps and time.monotonic() < deadline:
                time.sleep(0.001)
        return says.get(seed, "9")

    rows, stats, pool = _play(_fake(tiny_model, reply=reply), envs, k=1, max_turns=3, quarantine_after=3,
                              batching=batching, pool=pool)
    by_id = {r.episode_id: r for r in rows}
    dead, alive = by_id[killer.episode_id], by_id[survivor.episode_id]
    assert dead.error == "crashed" and dead.turns == []
    assert alive.error is None and [t["action"] for t in alive.turns] == ["1", "2", "3"]
    assert len(pool.opened) == 2 and not stats.quarantined
    assert [o["observation"] for o in alive.turns][-1].endswith("(turn 3)")
