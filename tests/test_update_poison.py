"""Nothing non-finite is published: `spade update` and `spade regret` refuse NaN and infinity in
what they read, compute and write, with one line naming the cause, exit 1 and no output.

Each guard is reached through the real CLI on the tiny model: a NaN ``designer_reward`` (the input
rows), a NaN weight in the input model (the loss, before the backward that would spread it), and
an fp16 checkpoint pushed past float16's range (the weights, before the checkpoint is written).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_spade
from tests.test_update import _config, make_artifacts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def artifacts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("poison_inputs"), tiny_model)


def _update(artifacts: dict, model: Path, out: Path, scores: Path | None = None, *extra: str):
    return run_spade("update", "--model", model, "--envs", artifacts["validated"], "--rollouts",
                     artifacts["rollouts"], "--scores", scores or artifacts["scores"], "--out", out,
                     "--learning-rate", "1e-3", *extra)


def _nothing_published(res, out: Path) -> None:
    assert res.returncode == 1, res.stderr
    assert res.stdout == "", "no summary line (and so no NaN in one) when the update fails"
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("error:")]) == 1
    assert "Traceback" not in res.stderr
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith((out.name, f".{out.name}"))]
    assert leftovers == [], leftovers


def test_a_nan_designer_reward_is_refused_with_its_row(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    rows = [json.loads(ln) for ln in artifacts["scores"].read_text().splitlines()]
    rows[1]["designer_reward"] = float("nan")
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes NaN, as a buggy tool would
    res = _update(artifacts, tiny_model, tmp_path / "ck", scores)
    _nothing_published(res, tmp_path / "ck")
    assert f"{scores}:2: field 'designer_reward' must be a finite number, got nan" in res.stderr


@pytest.mark.unit
def test_an_advantage_that_overflows_names_its_row(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Finite in Python, infinite in the float32 the advantages are computed in."""
    from spade_cli.core.artifacts import InputError
    from spade_cli.training.samples import collect_samples

    rows = [json.loads(ln) for ln in artifacts["scores"].read_text().splitlines()]
    rows[0]["designer_reward"] = 1e39
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _config({**artifacts, "scores": scores}, tiny_model, tmp_path / "ck")
    with pytest.raises(InputError, match=r"validated\.jsonl:1: the advantage computed from this row's reward"):
        collect_samples(cfg)


@pytest.mark.unit
def test_a_non_finite_setting_is_refused(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    from spade_cli.core.artifacts import SpadeError
    from stages import update

    with pytest.raises(SpadeError, match="--invalid-reward must be a finite number, got nan"):
        update.run(_config(artifacts, tiny_model, tmp_path / "ck", invalid_reward=math.nan))
    assert not (tmp_path / "ck").exists()


def test_a_nan_weight_in_the_input_stops_before_the_backward(artifacts: dict, tiny_model: Path,
                                                             tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    poisoned = tmp_path / "nan_model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = math.nan
    model.save_pretrained(poisoned)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(poisoned)
    res = _update(artifacts, poisoned, tmp_path / "ck")
    _nothing_published(res, tmp_path / "ck")
    assert "the loss at optimizer step 1/" in res.stderr and "is not finite" in res.stderr


def test_weights_that_overflow_the_served_dtype_are_not_published(artifacts: dict, tiny_model: Path,
                                                                 tmp_path: Path) -> None:
    """An fp16 checkpoint moved by a huge step: the fp32 masters are finite, their float16 cast is
    not; the loss of the one optimizer step was finite, so only the weight check can see it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    half = tmp_path / "fp16_model"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float16).save_pretrained(half)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(half)
    res = _update(artifacts, half, tmp_path / "ck", None, "--learning-rate", "1e6", "--max-grad-norm", "0",
                  "--per-device-train-batch-size", "64")
    _nothing_published(res, tmp_path / "ck")
    assert "the updated weights are not finite (NaN or infinite) in " in res.stderr


def test_regret_refuses_non_finite_returns_and_rewards(tmp_path: Path) -> None:
    from tests.test_regret_cli import _env, _episode, _write

    a = _env("Alpha")
    envs = _write(tmp_path / "validated.jsonl", [a, _env("Gamma", False, "syntax_error")])
    eps = [_episode(a["env_id"], h, p, r) for h in (True, False) for p, r in enumerate([1.0, 0.0])]
    rollouts = _write(tmp_path / "rollouts.jsonl", eps)
    base = ["regret", "--envs", envs, "--rollouts", rollouts, "--out", tmp_path / "scores.jsonl",
            "--embedding", "tfidf"]
    res = run_spade(*base, "--invalid-reward", "nan")  # the invalid Gamma's reward
    assert res.returncode == 1 and "designer_reward nan is not finite" in res.stderr, res.stderr
    assert not (tmp_path / "scores.jsonl").exists()
    _write(rollouts, [*eps[:2], {**eps[2], "return": math.nan}, eps[3]])
    res = run_spade(*base)
    assert res.returncode == 1 and f"{rollouts}:3: field 'return' must lie in [0, 1]" in res.stderr, res.stderr
    assert not (tmp_path / "scores.jsonl").exists()
