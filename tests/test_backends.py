"""The hf backend on the real tiny model, checked against a float32 transformers recomputation."""

from __future__ import annotations

import pytest

from spade_cli.backends import GenSample, Sampling, load_backend, render_chat

PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "Design a small puzzle about trains and timetables, please."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to five."}],
]


@pytest.fixture(scope="module")
def hf(tiny_model):
    return load_backend("hf", str(tiny_model), dtype="float32")


@pytest.fixture(scope="module")
def reference(tiny_model):
    """An independent float32 copy of the model for recomputing log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


def _prompts(tok) -> list[list[int]]:
    return [render_chat(tok, m) for m in PROMPTS]


def _recompute(model, prompt: list[int], sample: GenSample, temperature: float, top_p: float = 1.0) -> list[float]:
    """log p(token) under softmax(logits / T), renormalised over the top-p nucleus, one row, no padding."""
    import torch

    ids = torch.tensor([prompt + sample.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()  # mass strictly above each token
        keep = torch.zeros_like(logp, dtype=torch.bool).scatter(1, order, before < top_p)
        logp = torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)
    return logp.gather(1, torch.tensor(sample.token_ids)[:, None]).squeeze(1).tolist()


@pytest.mark.integration
def test_hf_all_prompts_and_samples_in_one_generate_call(hf):
    before = hf.calls
    out = hf.generate(_prompts(hf.tokenizer), n=4, sampling=Sampling(temperature=1.0, max_tokens=24, seed=3))
    assert hf.calls == before + 1
    assert [len(g) for g in out] == [4, 4, 4]
    for group in out:
        assert len({tuple(s.token_ids) for s in group}) > 1, "n samples of one prompt should differ"
        for s in group:
            assert len(s.logprobs) == len(s.token_ids) > 0
            assert s.finish_reason in ("stop", "length")
            assert all(lp <= 0.0 for lp in s.logprobs)


@pytest.mark.integration
def test_hf_batch_size_splits_rows_into_calls(tiny_model):
    small = load_backend("hf", str(tiny_model), batch_size=5)
    out = small.generate(_prompts(small.tokenizer), n=4, sampling=Sampling(max_tokens=4, seed=0))
    assert small.calls == 3  # 12 rows in chunks of 5
    assert sum(len(g) for g in out) == 12


@pytest.mark.integration
@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.3, 1.0), (1.0, 0.8)])
def test_hf_logprobs_match_float32_recomputation(hf, reference, temperature, top_p):
    prompts = _prompts(hf.tokenizer)
    out = hf.generate(prompts, n=2, sampling=Sampling(temperature=temperature, top_p=top_p, max_tokens=32, seed=7))
    # A token whose cumulative mass sits at top_p can fall inside the nucleus in one computation and
    # outside in another (summation order, threads, KV cache vs a full pass): its mass then moves the
    # normaliser. So a token's log-prob must match the nucleus cut at top_p or one cut within 1e-3.
    cuts = [top_p] if top_p >= 1.0 else [top_p, top_p - 1e-3, top_p + 1e-3]
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        for s in group:
            refs = [_recompute(reference, prompt, s, temperature, cut) for cut in cuts]
            worst = max(worst, max(min(abs(a - r[i]) for r in refs) for i, a in enumerate(s.logprobs)))
    assert worst < 1e-3, f"max |logprob - recomputed| = {worst}"


@pytest.mark.integration
def test_hf_greedy_is_argmax_and_identical_across_samples(hf, reference):
    import torch

    prompt = _prompts(hf.tokenizer)[1]
    [group] = hf.generate([prompt], n=3, sampling=Sampling(temperature=0.0, max_tokens=12))
    assert group[0].token_ids == group[1].token_ids == group[2].token_ids
    ids = torch.tensor([prompt + group[0].token_ids])
    with torch.no_grad():
        logits = reference(ids).logits[0, len(prompt) - 1:-1]
    assert logits.argmax(-1).tolist() == group[0].token_ids


@pytest.mark.integration
def test_hf_seed_reproduces_and_leaves_global_rng_alone(hf):
    import torch

    prompts = _prompts(hf.tokenizer)
    sampling = Sampling(temperature=1.0, max_tokens=16, seed=11)
    torch.manual_seed(123)
    expected_draw = torch.rand(1).item()
    torch.manual_seed(123)
    a = hf.generate(prompts, n=2, sampling=sampling)
    assert torch.rand(1).item() == expected_draw, "a seeded call must not consume the global RNG"
    b = hf.generate(prompts, n=2, sampling=sampling)
    c = hf.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_tokens=16, seed=12))
    ids = lambda out: [s.token_ids for g in out for s in g]  # noqa: E731
    assert ids(a) == ids(b)
    assert [s.logprobs for g in a for s in g] == [s.logprobs for g in b for s in g]
    assert ids(a) != ids(c)


@pytest.mark.integration
def test_hf_eos_is_kept_and_length_is_reported(hf):
    eos = set(hf.eos_ids)
    samples: list[GenSample] = []
    for seed in range(5, 25):  # until both kinds of ending have shown up (a random model ends at random)
        out = hf.generate(_prompts(hf.tokenizer), n=8, sampling=Sampling(temperature=1.5, max_tokens=160, seed=seed))
        samples += [s for g in out for s in g]
        stopped = [s for s in samples if s.finish_reason == "stop"]
        capped = [s for s in samples if s.finish_reason == "length"]
        if stopped and capped:
            break
    assert stopped and capped, "20 seeds never gave both kinds of endings on the tiny model"
    for s in stopped:
        assert s.token_ids[-1] in eos and not eos & set(s.token_ids[:-1])
        assert s.text == hf.tokenizer.decode(s.token_ids[:-1], skip_special_tokens=True)
    for s in capped:
        assert len(s.token_ids) == 160 and not eos & set(s.token_ids)


@pytest.mark.integration
def test_hf_stop_string_cuts_text_and_keeps_sampled_tokens(hf):
    prompt = _prompts(hf.tokenizer)[2]
    base = Sampling(temperature=1.0, max_tokens=48, seed=21)
    [[free]] = hf.generate([prompt], n=1, sampling=base)
    text = free.text
    # A short alphanumeric piece of the free-running text, found after a few characters.
    start = next(i for i in range(4, len(text) - 1) if text[i:i + 2].isalnum() and text[i:i + 2].isascii())
    stop = text[start:start + 2]
    first = text.find(stop)
    [[cut]] = hf.generate([prompt], n=1, sampling=Sampling(temperature=1.0, max_tokens=48, seed=21, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == text[:first]
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)]
    assert cut.logprobs == pytest.approx(free.logprobs[:len(cut.token_ids)], abs=1e-6)
    kept = hf.tokenizer.decode(cut.token_ids, skip_special_tokens=True)
    assert stop in kept and stop not in hf.tokenizer.decode(cut.token_ids[:-1], skip_special_tokens=True)


@pytest.mark.unit
def test_unknown_backend_and_bad_dtype_are_user_errors():
    from spade_cli.core.artifacts import SpadeError

    with pytest.raises(SpadeError, match="unknown backend"):
        load_backend("nope", "no-such-model")
    with pytest.raises(SpadeError, match="dtype"):
        load_backend("hf", "no-such-model", dtype="float8")


@pytest.mark.unit
def test_fake_backend_scripts_outputs_in_order(tmp_path, monkeypatch):
    import json

    script = tmp_path / "script.json"
    script.write_text(json.dumps(["alpha", "bet", "gamma"]))
    monkeypatch.setenv("SPADE_FAKE_OUTPUTS", str(script))
    fake = load_backend("fake", "no-such-model")
    ids = render_chat(fake.tokenizer, [{"role": "user", "content": "hi"}])
    assert fake.tokenizer.decode(ids) == "<user>hi</user>\n<assistant>"
    out = fake.generate([ids, ids], n=2, sampling=Sampling(max_tokens=4))
    assert [[s.text for s in g] for g in out] == [["alph", "bet"], ["gamm", "alph"]]
    assert [[s.finish_reason for s in g] for g in out] == [["length", "stop"], ["length", "length"]]
    assert fake.calls == 1 and fake.requests[0][1] == 2


@pytest.mark.integration
def test_hf_ignores_the_checkpoints_sampling_defaults(tiny_model, reference, tmp_path):
    """A Qwen3-like generation_config (top_k, top_p, temperature) must not change what Sampling asks for."""
    import json
    import shutil

    ckpt = tmp_path / "opinionated"
    shutil.copytree(tiny_model, ckpt)
    cfg = json.loads((ckpt / "generation_config.json").read_text())
    cfg.update(top_k=3, top_p=0.5, temperature=0.3, repetition_penalty=1.5)
    (ckpt / "generation_config.json").write_text(json.dumps(cfg))
    backend = load_backend("hf", str(ckpt))
    prompts = _prompts(backend.tokenizer)
    out = backend.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_tokens=32, seed=2))
    worst = max(abs(a - b) for p, g in zip(prompts, out, strict=True) for s in g
                for a, b in zip(s.logprobs, _recompute(reference, p, s, 1.0), strict=True))
    assert worst < 1e-3


@pytest.mark.integration
def test_hf_per_prompt_seeds_make_samples_independent_of_the_batch(hf, reference):
    """A resumed stage batches its leftover prompts differently: their samples must not change."""
    prompts = _prompts(hf.tokenizer)
    sampling = Sampling(temperature=1.0, top_p=0.9, max_tokens=24)
    together = hf.generate(prompts, n=2, sampling=sampling, seeds=[11, 12, 13])
    alone = hf.generate(prompts[-1:], n=2, sampling=sampling, seeds=[13])
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in together[-1]]
    assert together[-1][0].token_ids != together[-1][1].token_ids  # the n samples still differ
    other = hf.generate(prompts[-1:], n=2, sampling=sampling, seeds=[99])
    assert [s.token_ids for s in other[0]] != [s.token_ids for s in alone[0]]
    # the sampler still draws from the processed distribution it records
    for prompt, group in zip(prompts, together, strict=True):
        for s in group:
            expected = _recompute(reference, prompt, s, 1.0, 0.9)
            assert max(abs(a - b) for a, b in zip(s.logprobs, expected, strict=True)) < 1e-3
            assert all(lp > float("-inf") for lp in s.logprobs)
