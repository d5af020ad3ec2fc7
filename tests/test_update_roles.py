"""The role balance of `spade update` (spade_cli/training/role_balance.py): hand-computed plans and weights, the
per-row KL coefficient, and one real update through the CLI on a model from `spade init-model`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.training import role_balance as update_roles
from spade_cli.training.config import UpdateConfig


def _roles_of(steps: list, roles: list[str]) -> list[list[str]]:
    return [[roles[i] for mbs in ranks for mb in mbs for i in mb if i is not None] for ranks in steps]


@pytest.mark.unit
def test_six_episodes_and_two_designs_over_four_steps() -> None:
    """Keys (k + 0.5) / n: agents at 1/12, 3/12, ..., 11/12, designs at 3/12 and 9/12 (after the
    agent of the same key). Steps of 2: [a a] [d a] [a a] [d a]. With F = 0.25 over S = 4 steps the
    Agent (4 steps) weighs 0.75 * 4 / 4 = 0.75 per step, the Designer (2 steps) 0.25 * 4 / 2 = 0.5:
    over the pass 3 against 1, the stated 3 : 1."""
    roles = ["agent"] * 6 + ["designer"] * 2
    steps = update_roles.plan(roles, batch_size=2, grad_accum=1, world=1, epochs=1, seed=0)
    assert _roles_of(steps, roles) == [["agent", "agent"], ["designer", "agent"]] * 2
    cfg = UpdateConfig(model="m", designer_share=0.25)
    balance = update_roles.step_weights(steps, roles, update_roles.resolve_shares(cfg, set(roles)))
    assert balance == {"agent": {"share": 0.75, "steps_with_samples": 4, "step_weight": 0.75},
                       "designer": {"share": 0.25, "steps_with_samples": 2, "step_weight": 0.5}}


@pytest.mark.unit
def test_every_step_holds_both_roles_when_each_has_enough_samples() -> None:
    """12 episodes and 4 designs, steps of 4 on 2 processes x 1 micro-batch: 4 steps, each with 3
    episodes and 1 design, so the step weights are the shares themselves."""
    roles = ["agent"] * 12 + ["designer"] * 4
    steps = update_roles.plan(roles, batch_size=2, grad_accum=1, world=2, epochs=2, seed=3)
    assert len(steps) == 8 and all(sorted(r) == ["agent"] * 3 + ["designer"] for r in _roles_of(steps, roles))
    seen = [i for ranks in steps[:4] for mbs in ranks for mb in mbs for i in mb]
    assert sorted(seen) == list(range(16))  # one epoch is every sample once
    balance = update_roles.step_weights(steps, roles, {"agent": 0.6, "designer": 0.4})
    assert balance["agent"]["step_weight"] == pytest.approx(0.6)
    assert balance["designer"]["step_weight"] == pytest.approx(0.4)


@pytest.mark.unit
def test_one_role_is_grpo_plan_steps_exactly_and_gets_the_whole_update() -> None:
    from spade_cli.training import grpo

    roles = ["agent"] * 11
    assert update_roles.plan(roles, 3, 2, 2, 2, 7) == grpo.plan_steps(11, 3, 2, 2, 2, 7)
    cfg = UpdateConfig(model="m", designer_share=0.3)
    assert update_roles.resolve_shares(cfg, {"agent"}) == {"agent": 1.0, "designer": 0.0}
    assert update_roles.resolve_shares(cfg, {"designer"}) == {"agent": 0.0, "designer": 1.0}
    with pytest.raises(Exception, match=r"--designer-share must lie in \[0, 1\]"):
        update_roles.stated_shares(UpdateConfig(model="m", designer_share=1.5))


@pytest.mark.unit
def test_kl_coefficient_per_role_and_per_row() -> None:
    import torch

    from spade_cli.training import grpo

    assert update_roles.betas(UpdateConfig(model="m", beta=0.04, kl_designer=0.5)) == {"agent": 0.04, "designer": 0.5}
    torch.manual_seed(0)
    lp, old, ref = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    rows, _, kl = grpo.per_token_loss(lp, old, adv, mask, beta=torch.tensor([0.0, 0.5]), ref_logps=ref)
    plain, _, _ = grpo.per_token_loss(lp, old, adv, mask, beta=0.0)
    half, _, kl_half = grpo.per_token_loss(lp, old, adv, mask, beta=0.5, ref_logps=ref)
    assert torch.equal(rows[0], plain[0]) and torch.allclose(rows[1], half[1])
    assert torch.allclose(rows[1] - plain[1], 0.5 * kl_half[1]) and torch.equal(kl, kl_half)


@pytest.mark.integration
def test_a_real_update_states_its_shares(tmp_path: Path) -> None:
    from tests.conftest import run_spade
    from tests.test_update import make_artifacts

    model = tmp_path / "tiny"
    assert run_spade("init-model", "--out", model).returncode == 0
    art = make_artifacts(tmp_path, model)  # 9 episodes with signal and 6 designs
    out = tmp_path / "ck"
    res = run_spade("update", "--model", model, "--envs", art["validated"], "--rollouts", art["rollouts"],
                    "--scores", art["scores"], "--out", out, "--designer-share", "0.2", "--kl-designer", "0.1",
                    "--per-device-train-batch-size", "4", "--learning-rate", "1e-3")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["designer_share"] == 0.2
    roles = json.loads((out / "update.json").read_text())["roles"]
    # 15 samples in steps of 4: 4 steps; 6 designs spread over them reach every step
    assert {r: (v["share"], v["steps_with_samples"], v["beta"]) for r, v in roles.items()} == {
        "agent": (0.8, 4, 0.0), "designer": (0.2, 4, 0.1)}
    assert roles["designer"]["step_weight"] == pytest.approx(0.2)
    assert roles["designer"]["kl"] > 0.0  # measured against the reference for both roles
    manifest = json.loads((tmp_path / "ck.manifest.json").read_text())
    assert manifest["roles"]["designer"]["share"] == 0.2
