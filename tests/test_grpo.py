"""The GRPO family's advantage and loss functions against values computed by hand.

The batch: two sequences of three tokens; the third token of the first sequence is masked (an
environment token). Ratios are exp(logp - old_logp); advantages +1 and -0.5.
"""

from __future__ import annotations

import math

import pytest
import torch

from spade_cli.training import grpo

pytestmark = pytest.mark.unit

LOGPS = [[-1.0, -2.0, -0.5], [-1.5, -0.2, -3.0]]
OLD = [[-1.1, -2.0, -0.3], [-1.5, -0.6, -3.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
ADV = [1.0, -0.5]

# Per-token loss by hand, -min(r * A, clip(r, 0.8, 1.2) * A):
# row 0 (A = +1): r = e^0.1 (inside the clip range) and e^0 -> -e^0.1, -1 (third token masked)
# row 1 (A = -0.5): r = 1, e^0.4, 1 -> 0.5 * max(r, clip(r)) = 0.5, 0.5 * e^0.4, 0.5
ROW0 = [-math.exp(0.1), -1.0]
ROW1 = [0.5, 0.5 * math.exp(0.4), 0.5]
TOTAL = sum(ROW0) + sum(ROW1)


def _t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _loss(loss_type: str, **kw: object) -> float:
    ptl, _, _ = grpo.per_token_loss(_t(LOGPS), _t(OLD), _t(ADV), _t(MASK))
    return float(grpo.aggregate(ptl, _t(MASK), loss_type, **kw))


@pytest.mark.parametrize(("loss_type", "kwargs", "expected"), [
    ("grpo", {}, (sum(ROW0) / 2 + sum(ROW1) / 3) / 2),          # mean of per-sequence token means
    ("bnpo", {}, TOTAL / 5),                                     # token mean over the batch
    ("dr_grpo", {"max_completion_length": 4}, TOTAL / (2 * 4)),  # sequences x max length
    ("dapo", {"num_items": 10}, TOTAL / 10),                     # tokens of the whole optimizer step
])
def test_loss_types_match_hand_computation(loss_type: str, kwargs: dict, expected: float) -> None:
    assert _loss(loss_type, **kwargs) == pytest.approx(expected, abs=1e-12)


def test_loss_values_are_distinct_and_numeric() -> None:
    # Guards against a test that passes because every branch returns the same thing.
    values = {round(_loss("grpo"), 9), round(_loss("bnpo"), 9), round(_loss("dr_grpo", max_completion_length=4), 9),
              round(_loss("dapo", num_items=10), 9)}
    assert len(values) == 4
    assert _loss("grpo") == pytest.approx(-0.2353072, abs=1e-6)


def test_clip_higher_and_delta() -> None:
    # A ratio of e^0.4 = 1.49 with A = +1: the upper clip binds at epsilon 0.2 (-1.2) but not at
    # epsilon_high 0.5 (-e^0.4).
    lp, old, mask = _t([[0.0]]), _t([[-0.4]]), _t([[1.0]])
    ptl, ratio, _ = grpo.per_token_loss(lp, old, _t([1.0]), mask)
    assert float(ptl) == pytest.approx(-1.2)
    ptl, _, _ = grpo.per_token_loss(lp, old, _t([1.0]), mask, epsilon_high=0.5)
    assert float(ptl) == pytest.approx(-math.exp(0.4))
    # delta caps the unclipped ratio for A < 0: 0.5 * max(min(e^0.4, 1.3), 1.2) = 0.65
    ptl, _, _ = grpo.per_token_loss(lp, old, _t([-0.5]), mask, delta=1.3)
    assert float(ptl) == pytest.approx(0.65)
    assert float(ratio) == pytest.approx(math.exp(0.4))


def test_kl_term_k3_with_bias_correction() -> None:
    lp, old, ref, mask = _t([[-1.0]]), _t([[-1.1]]), _t([[-1.3]]), _t([[1.0]])
    d = -1.3 - -1.0
    k3 = math.exp(d) - d - 1
    r = math.exp(0.1)
    ptl, _, kl = grpo.per_token_loss(lp, old, _t([0.0]), mask, beta=0.04, ref_logps=ref)
    assert float(kl) == pytest.approx(k3 * r)
    assert float(ptl) == pytest.approx(0.04 * k3 * r)
    ptl, _, _ = grpo.per_token_loss(lp, old, _t([0.0]), mask, beta=0.04, ref_logps=ref,
                                    use_bias_correction_kl=False)
    assert float(ptl) == pytest.approx(0.04 * k3)


def test_sequence_level_ratio_is_the_masked_mean() -> None:
    _, ratio, _ = grpo.per_token_loss(_t(LOGPS), _t(OLD), _t(ADV), _t(MASK), importance_sampling_level="sequence")
    assert ratio.shape == (2, 1)
    assert float(ratio[0, 0]) == pytest.approx(math.exp((0.1 + 0.0) / 2))
    assert float(ratio[1, 0]) == pytest.approx(math.exp(0.4 / 3))


def test_weights_scale_the_policy_term_only() -> None:
    ptl, _, _ = grpo.per_token_loss(_t(LOGPS), _t(OLD), _t(ADV), _t(MASK), weights=_t([2.0, 0.0]))
    assert float(ptl[0, 0]) == pytest.approx(2 * ROW0[0])
    assert torch.all(ptl[1] == 0)


def test_group_advantages_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.7])
    groups = ["a", "a", "a", "a", "b", "b", "c"]
    # group a: mean 0.75, Bessel std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5; b has no spread; c is alone
    adv, keep = grpo.group_advantages(rewards, groups, "group")
    assert keep.tolist() == [True] * 4 + [False] * 3
    assert adv[:4].tolist() == pytest.approx([0.25 / 0.5001, -0.75 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001])
    assert adv[4:].tolist() == [0.0, 0.0, 0.0]
    adv, _ = grpo.group_advantages(rewards, groups, "none")
    assert adv[:4].tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25])
    adv, _ = grpo.group_advantages(rewards, groups, "batch")
    batch_std = float(rewards.double().std())
    assert adv[1].item() == pytest.approx(-0.75 / (batch_std + 1e-4), rel=1e-6)


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="loss_type"):
        grpo.aggregate(_t(LOGPS), _t(MASK), "ppo")
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo.group_advantages(torch.tensor([1.0]), [0], "rank")
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo.aggregate(_t(LOGPS), _t(MASK), "dr_grpo")


def test_clip_fractions_count_tokens_like_trl() -> None:
    # ratio e^0.4 > 1.2 with A > 0 is high-clipped; e^-0.4 < 0.8 with A < 0 is low-clipped
    lp, old = _t([[0.0, 0.0], [0.0, 0.0]]), _t([[-0.4, 0.0], [0.4, 0.0]])
    out = grpo.clip_fractions(torch.exp(lp - old), _t([1.0, -1.0]), _t([[1.0, 1.0], [1.0, 0.0]]))
    assert {k: float(v) for k, v in out.items()} == {"clip_low": 1.0, "clip_high": 1.0, "clip_region": 2.0,
                                                     "tokens": 3.0}


def test_plan_gives_every_process_the_same_number_of_micro_batches() -> None:
    # 5 samples, 2 per micro-batch, 2 micro-batches per step, 1 process: a full step of 4, then a
    # step with one sample and a stand-in micro-batch.
    steps = grpo.plan_steps(5, batch_size=2, grad_accum=2, world=1, epochs=1, seed=0)
    assert [[len(mb) for mb in ranks[0]] for ranks in steps] == [[2, 2], [1, 1]]
    assert steps[1][0][1] == [None]
    assert sorted(i for ranks in steps for mb in ranks[0] for i in mb if i is not None) == [0, 1, 2, 3, 4]
    # 2 processes x 2 epochs: every sample once per epoch, processes interleaved within a step
    steps = grpo.plan_steps(6, batch_size=1, grad_accum=2, world=2, epochs=2, seed=0)
    assert len(steps) == 4 and all(len(r) == 2 and all(len(mbs) == 2 for mbs in r) for r in steps)
    per_epoch = [sorted(i for ranks in steps[e * 2:(e + 1) * 2] for r in ranks for mb in r for i in mb
                        if i is not None) for e in range(2)]
    assert per_epoch == [[0, 1, 2, 3, 4, 5]] * 2


def test_sampler_correction_by_hand() -> None:
    # old - sampler per token: row 0: 0.1, 1.5 (| masked 2.0); row 1: -0.2, 0.0, -2.0
    old = _t([[-1.0, -0.5, -1.0], [-1.2, -1.0, -3.0]])
    sampler = _t([[-1.1, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    w, raw = grpo.sampler_correction(old, sampler, _t(MASK), "token_truncate", cap=3.0)
    assert raw[0].tolist() == pytest.approx([math.exp(0.1), math.exp(1.5), 1.0])  # masked token: ratio 1
    assert w[0].tolist() == pytest.approx([math.exp(0.1), 3.0, 1.0])  # e^1.5 = 4.48 capped at 3
    assert w[1].tolist() == pytest.approx([math.exp(-0.2), 1.0, math.exp(-2.0)])
    w, _ = grpo.sampler_correction(old, sampler, _t(MASK), "token_truncate", cap=3.0, cap_min=0.5)
    assert w[1, 2] == pytest.approx(0.5)
    w, _ = grpo.sampler_correction(old, sampler, _t(MASK), "token_mask", cap=3.0)
    assert w[0].tolist() == pytest.approx([math.exp(0.1), 0.0, 1.0])
    # sequence modes: exp of the summed difference: row 0 e^1.6 = 4.95, row 1 e^-2.2
    w, raw = grpo.sampler_correction(old, sampler, _t(MASK), "sequence_truncate", cap=3.0)
    assert w.shape == (2, 1) and raw[:, 0].tolist() == pytest.approx([math.exp(1.6), math.exp(-2.2)])
    assert w[:, 0].tolist() == pytest.approx([3.0, math.exp(-2.2)])
    w, _ = grpo.sampler_correction(old, sampler, _t(MASK), "sequence_mask", cap=3.0)
    assert w[:, 0].tolist() == pytest.approx([0.0, math.exp(-2.2)])
    with pytest.raises(ValueError, match="tis_mode"):
        grpo.sampler_correction(old, sampler, _t(MASK), "token", cap=3.0)


def test_sampler_correction_scales_the_policy_term_only() -> None:
    lp, old, ref, mask = _t([[-1.0]]), _t([[-1.0]]), _t([[-1.3]]), _t([[1.0]])
    ptl, _, kl = grpo.per_token_loss(lp, old, _t([1.0]), mask, beta=0.1, ref_logps=ref, is_ratio=_t([[0.5]]))
    assert float(ptl) == pytest.approx(-0.5 + 0.1 * float(kl))  # ratio 1, advantage 1, weight 0.5


def test_row_scales_normalise_each_role_alone() -> None:
    # one step: agent rows of 3 and 5 tokens in micro-batch a, a designer row of 2 tokens in a and
    # one of 4 tokens in b
    roles, tokens, mbs = ["agent", "agent", "designer", "designer"], [3, 5, 2, 4], ["a", "a", "a", "b"]
    assert grpo.row_scales("dapo", roles, tokens, mbs) == pytest.approx([1 / 8, 1 / 8, 1 / 6, 1 / 6])
    assert grpo.row_scales("grpo", roles, tokens, mbs) == pytest.approx([1 / 6, 1 / 10, 1 / 4, 1 / 8])
    assert grpo.row_scales("bnpo", roles, tokens, mbs) == pytest.approx([1 / 8, 1 / 8, 1 / 4, 1 / 8])
    assert grpo.row_scales("dr_grpo", roles, tokens, mbs, 10) == pytest.approx([1 / 20] * 4)
    # the agent's factors do not depend on the designer's rows being there
    assert grpo.row_scales("dapo", roles[:2], tokens[:2], mbs[:2]) == grpo.row_scales("dapo", roles, tokens, mbs)[:2]
    # one role, one micro-batch: exactly TRL's dapo (token sum / tokens)
    ptl, _, _ = grpo.per_token_loss(_t(LOGPS), _t(OLD), _t(ADV), _t(MASK))
    c = grpo.row_scales("dapo", ["agent"] * 2, [2, 3], [0, 0])
    assert float(((ptl * _t(MASK)).sum(-1) * _t(c)).sum()) == pytest.approx(_loss("dapo", num_items=5))
