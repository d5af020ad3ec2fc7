"""`spade eval`: real lm-eval and Reasoning Gym runs on the tiny model, offline; envs: suites
through the real rollout stage; the evalscope adapter's command line and report parsing; --compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from spade_cli.core.artifacts import SpadeError
from spade_cli.evaluation.evaluators import (
    EvalContext,
    TaskSpec,
    extract_answer,
    lm_rows,
    mean_stderr,
    parse_spec,
    parse_specs,
)
from stages.eval import evalscope_command, evalscope_rows
from tests.conftest import run_spade

HALF = '''
import gymnasium as gym

class Half(gym.Env):
    """Pays 0.5 on the first step whatever the action: the mean return is exactly 0.5."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say anything.", {}

    def step(self, action):
        return "done", 0.5, True, False, {}
'''


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _summary(proc) -> dict:  # noqa: ANN001
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.mark.integration
def test_eval_runs_reasoning_gym_and_local_lm_eval_tasks_offline(tiny_model: Path, tmp_path: Path) -> None:
    import reasoning_gym

    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", tiny_model, "--tasks", "rg:basic_arithmetic:3,lm:spade_tiny_qa,lm:spade_tiny_mc",
            "--out", out, "--limit", "3", "--max-tokens", "12", "--batch-size", "2"]
    proc = run_spade(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    got = {(r["task"], r["metric"]): r for r in rows}
    assert set(got) == {("rg:basic_arithmetic:3", "score"), ("lm:spade_tiny_qa", "exact_match"),
                        ("lm:spade_tiny_mc", "acc")}
    for r in rows:
        assert r["schema"] == "spade.eval/1" and r["n"] == 3 and r["model"] == str(tiny_model)
        assert r["backend"] == "hf" and 0.0 <= r["value"] <= 1.0
    assert got[("lm:spade_tiny_qa", "exact_match")]["harness"] == "lm-eval"
    # The rg score is the mean of reasoning-gym's own scorer over the logged extracted answers.
    logs = _rows(Path(f"{out}.rg") / "basic_arithmetic_3.jsonl")
    ds = reasoning_gym.create_dataset("basic_arithmetic", size=3, seed=0)
    assert [log["question"] for log in logs] == [ds[i]["question"] for i in range(3)]
    rescored = [ds.score_answer(extract_answer(log["completion"]), ds[i]) for i, log in enumerate(logs)]
    assert got[("rg:basic_arithmetic:3", "score")]["value"] == pytest.approx(sum(rescored) / 3)
    # lm-eval's own results and samples are kept beside eval.jsonl.
    results = json.loads((Path(f"{out}.lm_eval") / "spade_tiny_qa" / "results.json").read_text())
    assert results["results"]["spade_tiny_qa"]["exact_match,none"] == got[("lm:spade_tiny_qa", "exact_match")]["value"]
    assert len(_rows(Path(f"{out}.lm_eval") / "spade_tiny_mc" / "samples_spade_tiny_mc.jsonl")) == 3
    assert _summary(proc)["rows"] == 3 and Path(f"{out}.manifest.json").exists()

    again = run_spade(*args, cwd=tmp_path)
    assert again.returncode == 0 and _summary(again)["status"] == "up to date"
    changed = run_spade(*args[:-4], "--limit", "2", "--batch-size", "2", cwd=tmp_path)
    assert changed.returncode == 1 and "--force" in changed.stderr


@pytest.mark.integration
def test_eval_resumes_after_a_failed_task_without_redoing_finished_ones(tiny_model: Path, tmp_path: Path) -> None:
    from stages import eval as stage

    task_yaml = tmp_path / "tasks" / "late.yaml"
    task_yaml.parent.mkdir()
    src = Path(stage.__file__).resolve().parent.parent / "spade_cli" / "data" / "lm_tasks"
    task_yaml.write_text((src / "spade_tiny_qa.yaml").read_text().replace("spade_tiny_qa.jsonl", "late.jsonl")
                         .replace("task: spade_tiny_qa", "task: late_qa"))
    specs = stage.resolve_tasks(f"rg:basic_arithmetic:2,lm:{task_yaml}", None)
    out = tmp_path / "eval.jsonl"
    kwargs = dict(limit=2, max_tokens=8, batch_size=2)
    with pytest.raises(SpadeError, match="late"):  # its data file is missing: lm-eval fails after rg
        stage.run(str(tiny_model), specs, out, **kwargs)
    assert not out.exists() and len(list(tmp_path.glob("eval.jsonl.partial-*"))) == 1
    (task_yaml.parent / "late.jsonl").write_text((src / "spade_tiny_qa.jsonl").read_text())
    messages: list[str] = []
    result = stage.run(str(tiny_model), specs, out, log=messages.append, **kwargs)
    assert any("rg:basic_arithmetic:2: already done" in m for m in messages)
    assert [r["task"] for r in result["results"]] == ["rg:basic_arithmetic:2", "lm:late_qa"]
    assert len(_rows(out)) == 2


@pytest.mark.integration
def test_eval_envs_suite_reports_mean_unhinted_return(tiny_model: Path, tmp_path: Path) -> None:
    suite = tmp_path / "heldout.jsonl"
    suite.write_text(json.dumps({"schema": "spade.validation/1", "code": HALF, "hint": "anything works",
                                 "valid": True}) + "\n")
    out = tmp_path / "eval.jsonl"
    proc = run_spade("eval", "--model", tiny_model, "--tasks", f"envs:{suite}", "--out", out, "--k", "2",
                     "--max-turns", "2", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    got = {r["metric"]: r for r in _rows(out)}
    assert got["unhinted_return"]["value"] == pytest.approx(0.5) and got["unhinted_return"]["n"] == 2
    assert got["hinted_return"]["value"] == pytest.approx(0.5)
    assert Path(f"{out}.envs/heldout.rollouts.jsonl").exists()


@pytest.mark.integration
def test_compare_and_usage_errors(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    row = {"schema": "spade.eval/1", "metric": "score", "n": 10}
    a.write_text(json.dumps({**row, "task": "rg:x", "value": 0.25, "stderr": 0.03}) + "\n"
                 + json.dumps({**row, "task": "lm:only_a", "value": 0.5}) + "\n")
    b.write_text(json.dumps({**row, "task": "rg:x", "value": 0.75, "stderr": 0.04}) + "\n")
    proc = run_spade("eval", "--compare", a, b, env={"COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    result = _summary(proc)
    first = result["rows"][0]
    assert (first["task"], first["a"], first["b"]) == ("rg:x", 0.25, 0.75)
    assert first["diff"] == pytest.approx(0.5) and first["z"] == pytest.approx(0.5 / 0.05)
    assert result["rows"][1]["b"] is None and (result["only_a"], result["only_b"]) == (1, 0)
    assert "+0.5000" in proc.stderr

    b.write_text(b.read_text() + '{"schema": "spade.eval/1", "task": "t"}\n')
    bad = run_spade("eval", "--compare", a, b)
    assert bad.returncode == 1 and f"{b}:2" in bad.stderr.replace("\n", "")
    for args in (["--tasks", "xx:y"], ["--tasks", "rg:basic_arithmetic:0"], [],
                 ["--tasks", "evalscope:bfcl_v4"], ["--preset", "nope"]):
        proc = run_spade("eval", "--model", "m", "--out", tmp_path / "o.jsonl", *args)
        assert proc.returncode == 2, (args, proc.stderr)


@pytest.mark.integration
def test_compare_pairs_the_episodes_of_two_envs_evals_by_seed(tmp_path: Path) -> None:
    """Two evals of one suite on one --seed play the same (env, seed, pair): B - A per episode,
    computed by hand. Unpaired, the seed-to-seed spread hides the gain; paired, it cancels."""
    def episodes(path: Path, returns: list[float]) -> None:
        rows = [{"schema": "spade.rollout/1", "episode_id": f"e{i}{h}", "env_id": "env", "iteration": 0,
                 "hinted": h, "seed": 100 + i, "pair": i, "return": r}
                for i, r in enumerate(returns) for h in (False, True)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    before, after = [0.0, 0.25, 0.5, 1.0], [0.25, 0.5, 0.75, 1.0]  # + 0.25, 0.25, 0.25, 0
    for name, rets in (("a", before), ("b", after)):
        side = tmp_path / f"{name}.jsonl.envs"
        side.mkdir()
        episodes(side / "suite.rollouts.jsonl", rets)
        mean, stderr = mean_stderr(rets)
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(
            {"schema": "spade.eval/1", "task": "envs:suite.jsonl", "metric": "unhinted_return", "value": mean,
             "stderr": stderr, "n": 4, "episodes": f"{name}.jsonl.envs/suite.rollouts.jsonl"}) + "\n")
    proc = run_spade("eval", "--compare", tmp_path / "a.jsonl", tmp_path / "b.jsonl", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    [row] = _summary(proc)["rows"]
    # differences 0.25, 0.25, 0.25, 0: mean 0.1875, sample sd 0.125, stderr 0.0625, z 3
    assert row["paired_n"] == 4 and row["paired_diff"] == pytest.approx(0.1875)
    assert row["paired_stderr"] == pytest.approx(0.0625) and row["paired_z"] == pytest.approx(3.0)
    assert row["z"] < 1 < row["paired_z"]
    assert "+3.00 (n=4)" in proc.stderr
    (tmp_path / "b.jsonl.envs" / "suite.rollouts.jsonl").unlink()  # moved away: unpaired figures only
    [row] = _summary(run_spade("eval", "--compare", tmp_path / "a.jsonl", tmp_path / "b.jsonl"))["rows"]
    assert "paired_z" not in row and row["diff"] == pytest.approx(0.1875)


@pytest.mark.unit
def test_spec_parsing_and_answer_extraction() -> None:
    assert parse_spec("rg:logic:50") == TaskSpec("rg", "logic", 50)
    assert parse_spec("lm:path/to/task.yaml").name == "path/to/task.yaml"
    assert parse_spec("evalscope:bfcl_v4").label == "evalscope:bfcl_v4"
    assert [s.label for s in parse_specs("lm:a, rg:b:3,lm:a")] == ["lm:a", "rg:b:3"]
    for bad in ("aime25", "lm:", "rg:x:abc", "hub:x"):
        with pytest.raises(ValueError):
            parse_spec(bad)
    assert extract_answer("<think>maybe <answer>1</answer></think>so <answer> 42 </answer>") == "42"
    assert extract_answer("<think>long</think>\nI think\n  7  \n\n") == "7"
    assert extract_answer("<answer>a</answer> then <answer>b</answer>") == "b"
    assert extract_answer("") == ""
    assert mean_stderr([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, (1 / 3) ** 0.5 / 2))
    assert mean_stderr([1.0]) == (1.0, None) and mean_stderr([]) == (None, None)


@pytest.mark.unit
def test_lm_rows_from_an_lm_eval_results_dict(tmp_path: Path) -> None:
    ctx = EvalContext(model="m", out=tmp_path / "e.jsonl")
    results = {"results": {"gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.5,
                                     "exact_match_stderr,strict-match": 0.1, "exact_match,none": 0.25,
                                     "exact_match_stderr,none": "N/A"}},
               "n-samples": {"gsm8k": {"original": 100, "effective": 20}}}
    rows = {(r.task, r.metric): r for r in lm_rows(TaskSpec("lm", "gsm8k"), ctx, results)}
    assert set(rows) == {("lm:gsm8k", "exact_match,strict-match"), ("lm:gsm8k", "exact_match")}
    assert rows[("lm:gsm8k", "exact_match,strict-match")].stderr == 0.1
    assert rows[("lm:gsm8k", "exact_match")].stderr is None and rows[("lm:gsm8k", "exact_match")].n == 20


@pytest.mark.unit
def test_evalscope_command_and_report_parsing(tmp_path: Path) -> None:
    ctx = EvalContext(model="qwen", out=tmp_path / "e.jsonl", base_url="http://127.0.0.1:8000/v1/", limit=5,
                      max_tokens=256, batch_size=4, seed=3)
    spec = parse_spec("evalscope:live_code_bench")
    cmd = evalscope_command(spec, ctx, tmp_path / "w")
    assert cmd[:2] == ["evalscope", "eval"]
    assert cmd[-1] == "--no-timestamp"
    opts = dict(zip(cmd[2:-1:2], cmd[3:-1:2], strict=True))
    assert opts["--api-url"] == "http://127.0.0.1:8000/v1" and opts["--eval-type"] == "openai_api"
    assert opts["--datasets"] == "live_code_bench" and opts["--limit"] == "5" and opts["--seed"] == "3"
    assert json.loads(opts["--generation-config"]) == {"temperature": 0.0, "seed": 3, "max_tokens": 256}
    assert json.loads(opts["--dataset-args"]) == {"live_code_bench": {"subset_list": ["release_v6"]}}
    with pytest.raises(SpadeError, match="--base-url"):
        evalscope_command(spec, EvalContext(model="qwen", out=tmp_path / "e.jsonl"), tmp_path)

    report = tmp_path / "w" / "reports" / "qwen" / "live_code_bench.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"schema_version": 2, "dataset_name": "live_code_bench", "metrics": [
        {"identity": {"name": "accuracy", "aggregation": "pass_at_k", "dimensions": {"k": 1}}, "score": 0.375,
         "num": 8, "categories": []}]}))
    [row] = evalscope_rows(spec, ctx, tmp_path / "w")
    assert (row.task, row.metric, row.value, row.n, row.harness) == (
        "evalscope:live_code_bench", "accuracy,k=1", 0.375, 8, "evalscope")


@pytest.mark.unit
def test_evalscope_adapter_runs_the_given_executable(tmp_path: Path) -> None:
    """A stand-in executable with evalscope's CLI shape: checks the subprocess plumbing end to end."""
    from stages.eval import run_evalscope

    fake = tmp_path / "fake_evalscope.py"
    fake.write_text(
        "import json, sys, pathlib\n"
        "a = sys.argv[1:]\n"
        "opt = dict(zip(a[1::2], a[2::2]))\n"
        "p = pathlib.Path(opt['--work-dir'], 'reports', opt['--model'], opt['--datasets'] + '.json')\n"
        "p.parent.mkdir(parents=True)\n"
        "p.write_text(json.dumps({'metrics': [{'name': 'acc', 'score': 0.5, 'num': 2}]}))\n")
    ctx = EvalContext(model="qwen", out=tmp_path / "e.jsonl", base_url="http://127.0.0.1:9/v1",
                      evalscope_bin=f"{sys.executable} {fake}")
    [row] = run_evalscope(parse_spec("evalscope:bfcl_v4"), ctx)
    assert (row.metric, row.value, row.n) == ("acc", 0.5, 2)
    missing = EvalContext(model="qwen", out=tmp_path / "e.jsonl", base_url="http://x/v1", evalscope_bin="no-such-bin")
    with pytest.raises(SpadeError, match="needs evalscope"):
        run_evalscope(parse_spec("evalscope:acebench"), missing)
