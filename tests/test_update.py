"""`spade update` on the tiny model: learning direction, env-token masking, both roles, the real CLI.

Fixture artifacts are built by hand with the tiny model's tokenizer, in the shapes docs/architecture.md, 'Records' gives
(rollout, validation and score rows); sampler log-probs are the tiny model's own, so the
importance ratio starts at 1 as it would for fresh on-policy samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_spade

ENV_TEXT = "<|im_end|>\n<|im_start|>user\nobservation: the door is {}<|im_end|>\n<|im_start|>assistant\n"
GOOD, BAD = "open the door now", "sit and wait"


def _logps(model, prompt: list[int], completion: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def make_artifacts(root: Path, model_dir: Path, envs: int = 2, k: int = 4) -> dict[str, Path]:
    """Episodes (GOOD actions earn 1, BAD earn 0), designs in groups of three, and their scores."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spade_cli.backends import render_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rollouts, designs, scores = [], [], []
    for e in range(envs):
        env_id = f"env{e:02d}"
        for hinted in (False, True):
            for i in range(k):
                good = i % 2 == 0
                msgs = [{"role": "user", "content": f"Play environment {e}." + (" Hint: open it." if hinted else "")}]
                prompt = render_chat(tok, msgs)
                act = enc(GOOD if good else BAD)
                env = enc(ENV_TEXT.format("open" if good else "shut"))
                completion = act + env + act + [tok.eos_token_id]
                mask = [1] * len(act) + [0] * len(env) + [1] * (len(act) + 1)
                lps = _logps(model, prompt, completion)
                lps = [lp if m else None for lp, m in zip(lps, mask, strict=True)]
                rollouts.append({
                    "schema": "spade.rollout/1", "episode_id": f"{env_id}-{int(hinted)}-{i}", "env_id": env_id,
                    "iteration": 0, "hinted": hinted, "seed": i, "pair": i, "messages": msgs, "turns": [],
                    "return": 1.0 if good else 0.0, "terminated": True, "truncated": False, "error": None,
                    "tokens": {"prompt_ids": prompt, "completion_ids": completion, "env_mask": mask,
                               "logprobs": lps}})
        scores.append({"schema": "spade.score/1", "env_id": env_id, "iteration": 0, "signal": "regret",
                       "hinted_mean": 0.5, "unhinted_mean": 0.5, "hinted_n": k, "unhinted_n": k,
                       "regret": 0.1 * (e + 1), "regret_ci95": 0.1, "designer_reward": 0.1 * (e + 1)})
    # An episode the sandbox cut short: trained as return 0 whatever it recorded (the failure rule).
    errored = dict(rollouts[1], episode_id="env00-err", error="step_timeout", turns=[], **{"return": 1.0})
    rollouts.append(errored)
    for g in range(2):
        msgs = [{"role": "user", "content": f"Design an environment about document {g}."}]
        prompt = render_chat(tok, msgs)
        for s in range(3):
            env_id = f"env{s:02d}" if s < envs else "unscored"
            text = f"class Env{s}: pass  # design {g}.{s}"
            completion = enc(text) + [tok.eos_token_id]
            designs.append({
                "schema": "spade.validation/1", "env_id": env_id, "iteration": 0, "group_id": f"g{g}", "sample": s,
                "messages": msgs, "completion": text, "code": None if s == 2 else text, "hint": "open it",
                "tokens": {"prompt_ids": prompt, "completion_ids": completion,
                           "logprobs": _logps(model, prompt, completion)},
                "valid": s != 2, "reason": None if s != 2 else "no_code"})
    paths = {}
    for name, rows in (("rollouts", rollouts), ("validated", designs), ("scores", scores)):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def _config(paths: dict[str, Path], model: Path, out: Path, **kw: object):
    from stages.update import UpdateConfig

    base = dict(model=str(model), envs=[str(paths["validated"])], rollouts=[str(paths["rollouts"])],
                scores=[str(paths["scores"])], out=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                max_grad_norm=0.0)
    return UpdateConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def artifacts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("update_inputs"), tiny_model)


def _params(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _changed(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.integration
def test_fresh_samples_have_ratio_one(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """With no parameter change the training log-probs equal the stored sampler ones: padding,
    position ids and temperature line up, so nothing is clipped."""
    from stages import update

    stale = tmp_path / ".ck.tmp-99999"  # what a run killed mid-save leaves behind
    stale.mkdir()
    update.run(_config(artifacts, tiny_model, tmp_path / "ck", learning_rate=0.0))
    assert not stale.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck.manifest.json"]
    report = json.loads((tmp_path / "ck" / "update.json").read_text())
    assert report["metrics"]["clip_ratio"] == {"low": 0.0, "high": 0.0, "region": 0.0}
    assert report["counts"]["agent"]["failed_reward0"] == 1
    assert report["counts"]["designer"]["invalid"] == 2
    assert _changed(_params(tiny_model), _params(tmp_path / "ck")) == 0.0


@pytest.mark.integration
def test_learning_direction(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """After an update, episodes with positive advantage gain log-probability relative to negative ones."""
    from transformers import AutoModelForCausalLM

    from spade_cli.core.records import parse
    from stages import update

    update.run(_config(artifacts, tiny_model, tmp_path / "ck", envs=[], scores=[], num_iterations=2))
    before = AutoModelForCausalLM.from_pretrained(tiny_model)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    gain = {True: [], False: []}
    for line in artifacts["rollouts"].read_text().splitlines():
        ep = parse(json.loads(line))
        if ep.hinted or ep.error:
            continue
        t = ep.tokens
        sums = []
        for m in (before, after):
            lps = _logps(m, t["prompt_ids"], t["completion_ids"])
            sums.append(sum(lp for lp, keep in zip(lps, t["env_mask"], strict=True) if keep))
        gain[ep.return_ > 0].append(sums[1] - sums[0])
    good, bad = sum(gain[True]) / len(gain[True]), sum(gain[False]) / len(gain[False])
    assert good > 0 > bad, (good, bad)


@pytest.mark.integration
def test_env_tokens_get_exactly_zero_gradient(artifacts: dict, tiny_model: Path) -> None:
    import torch

    from spade_cli.training import grpo
    from spade_cli.training import policy as update_model
    from spade_cli.training import trainer as update_train
    from stages import update

    cfg = _config(artifacts, tiny_model, tiny_model.parent / "unused", envs=[], scores=[])
    samples, _ = update.collect_samples(cfg)
    tr = update_train.prepare(cfg, {1.0}, None, str(tiny_model))
    mb = grpo.collate(samples[:4], samples[0], tr.tokenizer.pad_token_id, tr.accelerator.device)
    logps, _ = update_model.logps(tr.model, mb)
    logps.retain_grad()
    ptl, _, _ = grpo.per_token_loss(logps, logps.detach(), mb["adv"], mb["mask"])  # ratio 1: no clipping
    grpo.aggregate(ptl, mb["mask"], "dapo").backward()
    env = (mb["mask"] == 0) & (torch.arange(logps.size(1))[None, :] < torch.tensor(
        [len(s.completion_ids) for s in samples[:4]])[:, None])
    assert env.sum() > 0
    assert torch.all(logps.grad[env] == 0)
    assert torch.all(logps.grad[mb["mask"] > 0] != 0)


@pytest.mark.integration
def test_both_roles_contribute(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Each role alone moves the weights (--designer-share 0 and 1), and the two together move them
    otherwise than either alone."""
    from stages import update

    base = _params(tiny_model)
    params = {}
    for name, share in (("agent", 0.0), ("designer", 1.0), ("both", 0.5)):
        update.run(_config(artifacts, tiny_model, tmp_path / name, designer_share=share))
        params[name] = _params(tmp_path / name)
    assert _changed(base, params["agent"]) > 1e-5 and _changed(base, params["designer"]) > 1e-5
    assert _changed(params["both"], params["agent"]) > 1e-6 and _changed(params["both"], params["designer"]) > 1e-6


@pytest.mark.integration
def test_bad_row_names_file_and_line(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    from spade_cli.core.artifacts import InputError
    from stages import update

    rows = artifacts["rollouts"].read_text().splitlines()
    bad = json.loads(rows[2])
    bad["tokens"]["env_mask"] = bad["tokens"]["env_mask"][:-1]
    rows[2] = json.dumps(bad)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"bad.jsonl:3: tokens.env_mask"):
        update.run(_config(artifacts, tiny_model, tmp_path / "ck", rollouts=[str(path)]))
    assert not (tmp_path / "ck").exists()


@pytest.mark.integration
def test_cli_end_to_end(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """The real command: a loadable checkpoint, update.json, manifest, then an up-to-date rerun
    and a refused rerun with another config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "iter_0001"
    args = ["update", "--model", tiny_model, "--envs", artifacts["validated"], "--rollouts",
            f"{artifacts['rollouts'].parent}/rollouts*.jsonl", "--scores", artifacts["scores"], "--out", out,
            "--loss-type", "grpo", "--learning-rate", "1e-3", "--per-device-train-batch-size", "4",
            "--gradient-accumulation-steps", "2", "--agent-episodes", "both", "--beta", "0.04"]
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["agent_samples"] == 17 and summary["designer_samples"] == 6
    report = json.loads((out / "update.json").read_text())
    m = report["metrics"]
    assert m["kl"] is not None and m["kl"] >= 0 and m["grad_norm"]["max"] > 0 and m["optimizer_steps"] == 3
    assert report["roles"]["agent"]["tokens"]["env_masked"] > 0
    assert report["roles"]["designer"]["advantage"]["n"] == 6
    assert (tmp_path / "iter_0001.manifest.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and model.config.vocab_size == len(tok)

    again = run_spade(*args)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    other = run_spade(*args[:-2], "--beta", "0.0")
    assert other.returncode == 1 and "beta" in other.stderr and "--force" in other.stderr


@pytest.mark.integration
def test_cli_usage_errors_exit_2(tiny_model: Path, tmp_path: Path) -> None:
    res = run_spade("update", "--model", tiny_model, "--rollouts", "x.jsonl", "--out", tmp_path / "o",
                    "--loss-type", "ppo")
    assert res.returncode == 2 and "--loss-type" in res.stderr


@pytest.mark.integration
@pytest.mark.slow  # minutes of CPU: CI's second tier (.ci/run)
def test_two_processes_match_one(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """torchrun with 2 CPU processes (gloo) x 2 sequences gives the same update as 1 process x 4:
    the plan, the token normaliser and the gradient averaging line up across processes."""
    import os
    import subprocess
    import sys

    common = ["--model", str(tiny_model), "--rollouts", str(artifacts["rollouts"]), "--envs",
              str(artifacts["validated"]), "--scores", str(artifacts["scores"]), "--learning-rate", "1e-3"]
    one = run_spade("update", *common, "--out", tmp_path / "one", "--per-device-train-batch-size", "4")
    assert one.returncode == 0, one.stderr
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "spade_cli",
                          "update", *common, "--out", str(tmp_path / "two"), "--per-device-train-batch-size", "2"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert two.returncode == 0, two.stderr
    assert len(two.stdout.strip().splitlines()) == 1  # one summary line, from rank 0
    reports = [json.loads((tmp_path / n / "update.json").read_text())["metrics"] for n in ("one", "two")]
    assert reports[1]["processes"] == 2
    assert reports[1]["grad_norm"]["max"] == pytest.approx(reports[0]["grad_norm"]["max"], rel=1e-4)
    # The gradients agree to 1e-4 (above); the weights after one Adam step agree up to float noise,
    # which Adam amplifies on coordinates whose gradient is ~0 (the step is ~lr * sign there), so
    # compare the disagreement with the size of the update itself.
    base, one_w, two_w = _params(tiny_model), _params(tmp_path / "one"), _params(tmp_path / "two")
    assert _changed(one_w, two_w) < 0.05 * _changed(base, one_w)


def test_designer_reward_comes_from_the_designs_score_row(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """regret scores every design, invalid ones included; its row wins over --invalid-reward."""
    from stages.update import collect_samples

    scores = tmp_path / "scores.jsonl"
    extra = {"schema": "spade.score/1", "env_id": "whatever", "iteration": 0, "signal": "regret",
             "hinted_mean": None, "unhinted_mean": None, "hinted_n": 0, "unhinted_n": 0, "regret": None,
             "regret_ci95": None, "designer_reward": -0.7, "group_id": "g0", "sample": 2, "valid": False}
    scores.write_text(artifacts["scores"].read_text() + json.dumps(extra) + "\n")
    paths = {**artifacts, "scores": scores}
    samples, _ = collect_samples(_config(paths, tiny_model, tmp_path / "out", invalid_reward=-0.3))
    by_group = {}
    for s in samples:
        if s.role == "designer":
            by_group.setdefault(s.group[1], []).append(s.reward)
    assert sorted(by_group["g0"]) == pytest.approx([-0.7, 0.1, 0.2])  # the score row of g0/2
    assert sorted(by_group["g1"]) == pytest.approx([-0.3, 0.1, 0.2])  # no row: --invalid-reward


@pytest.mark.integration
def test_no_learning_signal_passes_the_model_through(artifacts: dict, tiny_model: Path, tmp_path: Path) -> None:
    """Early iterations often have every return 0: the loop must go on from the same weights."""
    flat = tmp_path / "flat.jsonl"
    rows = [json.loads(x) for x in artifacts["rollouts"].read_text().splitlines()]
    flat.write_text("".join(json.dumps({**r, "return": 0.0}) + "\n" for r in rows))
    out = tmp_path / "ckpt"
    res = run_spade("update", "--model", tiny_model, "--rollouts", flat, "--out", out)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["unchanged"] is True and summary["samples"] == 0
    assert _changed(_params(tiny_model), _params(out)) == 0.0
    report = json.loads((out / "update.json").read_text())
    assert report["unchanged"] is True and "no sample carries a learning signal" in report["reason"]
    manifest = json.loads((tmp_path / "ckpt.manifest.json").read_text())
    assert manifest["warnings"] and run_spade("update", "--model", tiny_model, "--rollouts", flat,
                                              "--out", out).returncode == 0
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)


@pytest.mark.unit
def test_an_episode_from_a_text_mode_server_has_no_sampler_logprobs(tmp_path: Path) -> None:
    from spade_cli.core.artifacts import InputError
    from spade_cli.training.samples import _tokens

    # `transformers serve` gives no log-probs: None at every token, agent and env alike
    row = {"prompt_ids": [1, 2], "completion_ids": [3, 4, 5], "env_mask": [1, 0, 1], "logprobs": [None] * 3}
    assert _tokens(tmp_path, 1, row, need_env_mask=True)[3] is None
    row["logprobs"] = [-0.5, None, -0.25]  # a sampler that gave them: kept, 0 at env tokens
    assert _tokens(tmp_path, 1, row, need_env_mask=True)[3] == [-0.5, 0.0, -0.25]
    row["logprobs"] = [-0.5, None, None]  # some but not all agent tokens: a broken row, still refused
    with pytest.raises(InputError, match="finite numbers"):
        _tokens(tmp_path, 1, row, need_env_mask=True)
