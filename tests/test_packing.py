"""Padding-free training: the packed layout by hand, and packed rows equal to padded ones on the tiny model.

The equality tests run the real tiny Qwen3 (``spade init-model``) on the CPU, with SDPA (switched
to spade's row-wise SDPA) and with eager attention (transformers' block-diagonal mask, built from
the position ids alone): a row that saw another row would change its log-probs by far more than
the tolerances here (attending across the packed row moves them by about 0.6).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from spade_cli.training import grpo, packing
from tests.test_update import ENV_TEXT, GOOD, _config, _params, make_artifacts


def _sample(prompt: list[int], completion: list[int], mask: list[int] | None = None, temperature: float = 1.0,
            advantage: float = 1.0) -> grpo.Sample:
    return grpo.Sample("agent", ("agent", 0), 1.0, prompt, completion, mask or [1] * len(completion), None,
                       advantage=advantage, temperature=temperature)


@pytest.mark.unit
def test_packed_layout_by_hand() -> None:
    """Two rows and a stand-in: ids end to end, positions restart, labels only at trained tokens,
    each completion token's log-prob read from the output before it."""
    a = _sample([11, 12], [13, 14, 15], [1, 0, 1], temperature=0.5)
    b = _sample([21], [22, 23])
    mb = grpo.collate([a, b, None], a, 0, "cpu", packed=True)
    assert mb["input_ids"].tolist() == [[11, 12, 13, 14, 15, 21, 22, 23, 11, 12, 13, 14, 15]]
    assert mb["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4]]
    # Environment token 14 and the zero-weight stand-in are scored by nobody.
    assert mb["labels"].tolist() == [[-100, -100, 13, -100, 15, -100, 22, 23] + [-100] * 5]
    # Output j scores token j + 1: token 13 (packed 2) from output 1, token 22 (packed 6) from output 5.
    assert mb["index"].tolist() == [1, 2, 3, 5, 6, 9, 10, 11]
    assert mb["valid"].tolist() == [[True] * 3, [True, True, False], [True] * 3]
    assert mb["temperature"].flatten().tolist() == [0.5] * 5 + [1.0] * 3 + [0.5] * 5
    assert mb["mask"].tolist() == [[1, 0, 1], [1, 1, 0], [0, 0, 0]]
    padded = grpo.collate([a, b, None], a, 0, "cpu")
    for key in ("mask", "old", "sampler", "adv", "real", "attention_mask"):
        assert torch.equal(mb[key], padded[key]), key
    with pytest.raises(ValueError, match="prompt token"):
        grpo.collate([_sample([], [1])], a, 0, "cpu", packed=True)


def _rows(tok: object) -> list:
    """Rows of different lengths, one a multi-turn episode whose environment turn is masked, and
    two temperatures."""
    rng = random.Random(0)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    act, env = enc(GOOD), enc(ENV_TEXT.format("open"))
    turns = act + env + act + [tok.eos_token_id]
    rows = [_sample(enc("Play environment 0."), turns, [1] * len(act) + [0] * len(env) + [1] * (len(act) + 1),
                    temperature=0.7, advantage=0.8)]
    for p, c, t in ((17, 5, 1.0), (3, 29, 0.7), (9, 12, 1.0)):
        rows.append(_sample(rng.sample(vocab, p), rng.sample(vocab, c), temperature=t, advantage=rng.uniform(-1, 1)))
    return rows


def _pass(model: object, temps: object, rows: list, packed: bool) -> tuple:
    from spade_cli.training import policy as update_model

    model.zero_grad()
    mb = grpo.collate(rows, rows[0], 0, "cpu", packed=packed)
    lp, ent = update_model.logps(model, mb, temps)
    old = lp.detach() - 0.1 * mb["mask"]  # ratios off 1, some clipped
    ptl, _, _ = grpo.per_token_loss(lp, old, mb["adv"], mb["mask"])
    loss = grpo.aggregate(ptl, mb["mask"], "dapo")
    loss.backward()
    return lp.detach(), ent.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_equals_padded(tiny_model: Path, attention: str) -> None:
    """Per-token log-probs, entropies, the loss and every parameter's gradient agree between the
    layouts, environment tokens get nothing, and the stand-in row changes nothing."""
    from transformers import AutoTokenizer

    from spade_cli.training import policy as update_model

    temps = update_model.RowTemperature()
    model = update_model.load(str(tiny_model), 1.0, temps)
    model.config._attn_implementation = attention
    # eager packs only on request: its (N, N) mask costs more than the padding it saves
    assert packing.enabled("auto", model) == (attention == "sdpa")
    rows = _rows(AutoTokenizer.from_pretrained(tiny_model))
    padded, packed = _pass(model, temps, rows, False), _pass(model, temps, rows, True)
    assert model.config._attn_implementation == (packing.ROWWISE if attention == "sdpa" else "eager")
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(packed[1], padded[1], rtol=0, atol=2e-6)
    torch.testing.assert_close(packed[2], padded[2], rtol=1e-6, atol=0)
    for name, grad in padded[3].items():
        torch.testing.assert_close(packed[3][name], grad, rtol=1e-4, atol=1e-7, msg=name)
    assert sum(float(g.abs().sum()) for g in packed[3].values()) > 0
    env = torch.tensor(rows[0].mask) == 0
    assert env.sum() > 0 and torch.all(packed[0][0, :len(env)][env] == 0)
    assert torch.all(packed[0][1, 5:] == 0)  # past the end of a short completion
    # A zero-weight stand-in (a short last step) leaves the gradient as it was.
    with_none = _pass(model, temps, [*rows, None], True)
    for name, grad in packed[3].items():
        torch.testing.assert_close(with_none[3][name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.integration
def test_which_models_pack(tiny_model: Path) -> None:
    from spade_cli.core.artifacts import SpadeError
    from spade_cli.training import policy as update_model

    model = update_model.load(str(tiny_model), 1.0, None)
    assert packing.unsupported(model) is None
    assert packing.enabled("on", model) and not packing.enabled("off", model)
    cfg = model.config
    cfg.sliding_window = 16  # row-wise SDPA has no window: packed only on request, through the (N, N) mask
    assert not packing.enabled("auto", model) and packing.enabled("on", model)
    cfg.sliding_window = None
    cfg.layer_types = ["full_attention", "linear_attention"]
    assert "linear_attention" in packing.unsupported(model)
    assert not packing.enabled("auto", model)
    with pytest.raises(SpadeError, match="--packing on: layers of type linear_attention"):
        packing.enabled("on", model)
    cfg.layer_types = ["full_attention"] * 2
    cfg._attn_implementation = "my_attention"  # unknown to transformers' mask functions
    assert "has no transformers mask function" in packing.unsupported(model)
    with pytest.raises(SpadeError, match="packing must be one of"):
        packing.enabled("yes", model)


@pytest.mark.integration
def test_update_packed_equals_padded(tiny_model: Path, tmp_path: Path) -> None:
    """`spade update` with --packing on and off (and gradient checkpointing): the same loss and
    entropy, weights equal to rounding, and update.json says which layout ran; the layout is not
    part of the run's identity."""
    from stages import update

    artifacts = make_artifacts(tmp_path, tiny_model)
    out = {}
    for mode in ("on", "off"):
        # gradient checkpointing: the backward recomputes each layer's forward, attention included
        update.run(_config(artifacts, tiny_model, tmp_path / mode, packing=mode, num_iterations=2,
                           gradient_checkpointing=True))
        out[mode] = json.loads((tmp_path / mode / "update.json").read_text())["metrics"], _params(tmp_path / mode)
    (on, w_on), (off, w_off) = out["on"], out["off"]
    assert on["packed"] is True and off["packed"] is False
    assert packing.ROWWISE not in (tmp_path / "on" / "config.json").read_text()  # the served model is plain
    assert on["loss"] == pytest.approx(off["loss"], rel=1e-4, abs=1e-7)
    assert on["entropy"] == pytest.approx(off["entropy"], rel=1e-5)
    base = _params(tiny_model)
    l2 = lambda a, b: sum(float(((a[k] - b[k]) ** 2).sum()) for k in base) ** 0.5  # noqa: E731
    # An L2 bound, not an elementwise one: Adam's first steps move each weight by about
    # lr * g / |g|, so a gradient element that is nearly zero (a sum that cancels, exact only to
    # rounding) can move its weight by a fraction of lr either way.
    assert l2(w_on, w_off) < 1e-3 * l2(w_off, base)
    again = update.run(_config(artifacts, tiny_model, tmp_path / "on", packing="off", num_iterations=2,
                               gradient_checkpointing=True))
    assert again["status"] == "up to date"


@pytest.mark.integration
def test_row_without_prompt_refused(tiny_model: Path, tmp_path: Path) -> None:
    """A row's first completion token needs a prompt token to be scored from (packed, it would be
    scored from the row before): an empty prompt is refused with the file and line."""
    from spade_cli.core.errors import InputError
    from stages import update

    artifacts = make_artifacts(tmp_path, tiny_model, envs=1, k=2)
    rows = artifacts["rollouts"].read_text().splitlines()
    bad = json.loads(rows[1])
    bad["tokens"]["prompt_ids"] = []
    artifacts["rollouts"].write_text("\n".join([rows[0], json.dumps(bad), *rows[2:]]) + "\n")
    with pytest.raises(InputError, match=r"rollouts.jsonl:2: tokens.prompt_ids/completion_ids must be non-empty"):
        update.collect_samples(_config(artifacts, tiny_model, tmp_path / "ck"))
