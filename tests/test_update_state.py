"""`spade update` across the stage boundary: trainer state, sampler correction, roles, references.

The headline check: ten chained `spade update` runs on a bf16 checkpoint at lr 1e-6 end with the
same fp32 master weights as one process taking the same ten passes, and every served bf16
checkpoint is exactly those masters rounded. Without the trainer state most of each update is
rounded away at the checkpoint boundary (the audit in update.json says how much).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_spade
from tests.test_update import _config, _params, make_artifacts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bf16_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("models") / "tiny-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bf16_artifacts(bf16_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("bf16_inputs"), bf16_model)


@pytest.fixture(scope="module")
def artifacts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("state_inputs"), tiny_model)


def _masters(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(ckpt / "trainer_state" / "model.safetensors"))


def test_ten_chained_bf16_updates_equal_one_process(bf16_artifacts: dict, bf16_model: Path, tmp_path: Path) -> None:
    import torch

    from spade_cli.training import trainer as update_train
    from stages import update

    kw = dict(learning_rate=1e-6, max_grad_norm=1.0)
    prev = bf16_model
    for i in range(10):
        out = tmp_path / f"iter_{i + 1:04d}"
        summary = update.run(_config(bf16_artifacts, prev, out, **kw))
        assert summary["resumed_state"] == (None if i == 0 else str(prev / "trainer_state"))
        served, masters = _params(out), _masters(out)
        assert "lm_head.weight" not in served  # tied embeddings stay tied
        assert all(v.dtype == torch.bfloat16 for v in served.values())
        assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
        for k, v in served.items():  # the served checkpoint is the masters, rounded
            assert torch.equal(v, masters[k].to(torch.bfloat16)), k
        prev = out
    report = json.loads((prev / "update.json").read_text())
    assert report["trainer_state"]["updates"] == 10
    # At lr 1e-6 most of one update is below bf16's resolution: the state carries it.
    assert report["audit"]["rounding_lost_fraction"] > 0.5 and report["audit"]["residual_l2"] > 0

    cfg = _config(bf16_artifacts, bf16_model, tmp_path / "unused", **kw)
    samples, _ = update.collect_samples(cfg)
    tr = update_train.prepare(cfg, {s.temperature for s in samples}, None, str(bf16_model))
    for _ in range(10):
        update_train.train_pass(tr, cfg, samples, lambda _m: None)
    one = {k: v.detach().float() for k, v in tr.model.state_dict().items()}
    chained, start = _masters(prev), _params(bf16_model)
    moved = max(float((one[k] - start[k].float()).abs().max()) for k in chained)
    assert moved > 1e-6
    diff = max(float((one[k] - chained[k]).abs().max()) for k in chained)
    assert diff <= 1e-3 * moved, (diff, moved)
    assert tr.counters["optimizer_steps"] == report["trainer_state"]["optimizer_steps"]


def test_cli_resumes_state_and_prunes(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Through the real command: the second update finds the first one's state with no flag, the
    manifest says so, loaders ignore trainer_state/, --fresh-optimizer opts out, pruning leaves a
    marker that a later resume names, and the pruned checkpoint's consumers stay up to date."""
    from transformers import AutoModelForCausalLM

    common = ["--rollouts", artifacts["rollouts"], "--envs", artifacts["validated"], "--scores",
              artifacts["scores"], "--learning-rate", "1e-3", "--per-device-train-batch-size", "4"]
    a, b, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "fresh"
    first = ["update", "--model", tiny_model, "--out", a, *common]
    assert run_spade(*first).returncode == 0
    res = run_spade("update", "--model", a, "--out", b, "--keep-state-every", "2", *common)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["resumed_state"] == str(a / "trainer_state")
    manifest = json.loads((tmp_path / "b.manifest.json").read_text())
    assert manifest["trainer_state"]["resumed"] == str(a / "trainer_state")
    assert manifest["trainer_state"]["updates"] == 2 and manifest["trainer_state"]["bytes"] > 0
    AutoModelForCausalLM.from_pretrained(b)  # trainer_state/ does not disturb transformers
    # a's state (update 1) was superseded and 1 % 2 != 0: pruned to its counters
    assert [p.name for p in (a / "trainer_state").iterdir()] == ["spade_state.json"]
    assert json.loads(run_spade(*first).stdout)["status"] == "up to date"
    again = run_spade("update", "--model", a, "--out", tmp_path / "c", *common)
    assert again.returncode == 1 and "pruned" in again.stderr and "--fresh-optimizer" in again.stderr
    res = run_spade("update", "--model", a, "--out", fresh, "--fresh-optimizer", *common)
    assert res.returncode == 0 and json.loads(res.stdout)["resumed_state"] is None
    f_w, b_w = _masters(fresh), _masters(b)
    assert any(not (f_w[k] == b_w[k]).all() for k in b_w)  # a new Adam takes another step


def test_designer_share_zero_equals_agent_only(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from stages import update

    update.run(_config(artifacts, tiny_model, tmp_path / "zero", designer_share=0.0, max_grad_norm=1.0))
    update.run(_config(artifacts, tiny_model, tmp_path / "agent", envs=[], scores=[], max_grad_norm=1.0))
    z, a = _masters(tmp_path / "zero"), _masters(tmp_path / "agent")
    assert all(torch.equal(z[k], a[k]) for k in a)
    report = json.loads((tmp_path / "zero" / "update.json").read_text())
    assert report["counts"]["designer"] == {"left_out": "share 0"}


def _with_gen(path: Path, out: Path, **gen: object) -> Path:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    out.write_text("".join(json.dumps({**r, "gen": gen}) + "\n" for r in rows))
    return out


def test_top_p_samples_are_corrected_or_refused(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Designs drawn with top-p 0.9 train with the sampler correction on (their stored, renormalised
    log-probs give the weight) and are refused with it off; a rollout file's manifest is read when
    its rows record no sampling parameters."""
    from spade_cli.core.artifacts import InputError
    from stages import update

    designs = _with_gen(artifacts["validated"], tmp_path / "designs.jsonl", temperature=1.0, top_p=0.9)
    paths = {**artifacts, "validated": designs}
    with pytest.raises(InputError, match=r"designs.jsonl:1: sampled with top-p 0.9"):
        update.run(_config(paths, tiny_model, tmp_path / "off", tis=False))
    update.run(_config(paths, tiny_model, tmp_path / "on"))
    sampler = json.loads((tmp_path / "on" / "update.json").read_text())["sampler"]
    assert sampler["enabled"] and sampler["rows_with_sampler_logprobs"] > 0 and "weight" in sampler

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(artifacts["rollouts"].read_text())
    Path(f"{rollouts}.manifest.json").write_text(json.dumps({"config": {"temperature": 1.0, "top_p": 0.5}}))
    with pytest.raises(InputError, match=r"rollouts.jsonl:1: sampled with top-p 0.5"):
        update.run(_config({**artifacts, "rollouts": rollouts}, tiny_model, tmp_path / "r", envs=[],
                           scores=[], tis=False))


def test_each_role_is_scored_at_its_own_temperature(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Designs sampled at 0.5 (log-probs stored at 0.5) next to episodes at 1.0: with no weight
    change the trainer's log-probs equal the stored ones for both roles (the TIS weights are 1);
    a flag that contradicts the rows is refused."""
    import torch
    from transformers import AutoModelForCausalLM

    from spade_cli.core.artifacts import InputError
    from stages import update

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    rows = [json.loads(x) for x in artifacts["validated"].read_text().splitlines()]
    for r in rows:
        t = r["tokens"]
        ids = torch.tensor([t["prompt_ids"] + t["completion_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(t["prompt_ids"]) - 1:-1].float() / 0.5
        t["logprobs"] = logits.log_softmax(-1).gather(-1, torch.tensor(t["completion_ids"])[:, None])[:, 0].tolist()
        r["gen"] = {"temperature": 0.5, "top_p": 1.0}
    designs = tmp_path / "designs.jsonl"
    designs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = {**artifacts, "validated": designs}
    update.run(_config(paths, tiny_model, tmp_path / "ck", learning_rate=0.0))
    report = json.loads((tmp_path / "ck" / "update.json").read_text())
    assert report["roles"]["designer"]["temperature"] == [0.5] and report["roles"]["agent"]["temperature"] == [1.0]
    assert report["sampler"]["logp_diff_abs"]["max"] < 1e-4
    assert report["metrics"]["clip_ratio"]["region"] == 0.0
    with pytest.raises(InputError, match="designs.jsonl:1: sampled at temperature 0.5 but --designer-temperature"):
        update.run(_config(paths, tiny_model, tmp_path / "bad", designer_temperature=1.0))


def test_kl_reference_base_is_the_first_model(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    from stages import update

    kw = dict(beta=0.04, envs=[], scores=[])
    update.run(_config(artifacts, tiny_model, tmp_path / "one", **kw))
    kls = {}
    for ref in ("base", "previous"):
        update.run(_config(artifacts, tmp_path / "one", tmp_path / ref, kl_reference=ref, **kw))
        report = json.loads((tmp_path / ref / "update.json").read_text())
        kls[ref] = report["metrics"]["kl"]
        want = tiny_model if ref == "base" else tmp_path / "one"
        assert report["kl_reference"]["path"] == str(want.resolve())
    # the base is one update further away than the previous checkpoint
    assert kls["base"] > 2 * kls["previous"] >= 0, kls
