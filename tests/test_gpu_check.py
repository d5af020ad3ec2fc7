"""The GPU check (recipes/gpu_check.sh -> recipes/gpu_check.py run) on its CPU path (DRY=1), and what
keeps its figures when a part breaks.

The dry run is the real script end to end at toy sizes: a folder of wheels installed offline,
every part under its own time limit, each part's record appended to OUT/parts.jsonl as it ends,
one summary line. Its figures
are no measurement. A second run breaks two parts on purpose (a wheel folder that does not install,
a part killed at its limit) and the rest still report; a third has no budget left and says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

PARTS = ["install", "build", "update1", "update2", "zero2", "resume", "generate", "vllm"]


def _check(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "DRY": "1", "WORK": str(tmp_path / "w"), "OUT": str(tmp_path / "out"),
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    res = subprocess.run(["bash", str(REPO / "recipes" / "gpu_check.sh")], capture_output=True, text=True,
                         env=env, timeout=1700)
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, (res.stdout, res.stderr[-3000:])
    return res, json.loads(lines[0])


def _record_module():
    spec = importlib.util.spec_from_file_location("gpu_check_record", REPO / "recipes" / "gpu_check_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(folder: Path) -> None:
    """A minimal pure-Python wheel, written by hand: one module, one requirement nobody meets."""
    import zipfile

    info = "gpu_check_probe-0.0.1.dist-info"
    files = {"gpu_check_probe.py": "VALUE = 1\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.0.1\n"
                                 "Requires-Dist: torch\nRequires-Dist: no-such-package-xyz\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir()
    with zipfile.ZipFile(folder / "gpu_check_probe-0.0.1-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


@pytest.mark.integration
@pytest.mark.timeout(1800)  # about a minute on an idle 2-core VM; its nine python starts crawl on a busy one
def test_the_dry_run_reports_every_part(tmp_path: Path, _offline_caches: None) -> None:
    _wheel(tmp_path / "wheels")
    res, out = _check(tmp_path, WHEELS=str(tmp_path / "wheels"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert out["dry"] is True and out["status"] == "ok" and out["not_ok"] == [] and list(out["parts"]) == PARTS
    assert out["skipped"] == ["vllm", "zero2"]
    p = out["parts"]
    # installed offline into the work folder, with what it needs and nobody has named
    assert p["install"]["status"] == "ok" and p["install"]["wheels"] == 1
    assert p["install"]["unmet"] == ["gpu-check-probe needs no-such-package-xyz (have none)"]
    assert (tmp_path / "w" / "site" / "gpu_check_probe.py").exists()
    assert all(v == "ok" for m, v in p["install"]["imports"].items() if m != "deepspeed")
    assert p["build"]["device"] == "cpu" and p["build"]["vocab"] == 1024 and p["build"]["tied"] is False
    first, second = p["update1"], p["update2"]
    assert not first["resumed"] and second["resumed"] and second["state_load_s"] is not None
    for u in (first, second):
        assert u["status"] == "ok" and u["processes"] == 1 and u["optimizer_steps"] == 4
        assert u["tokens_per_s"] > 0 and u["old_logps_s"] > 0 and u["state_bytes"] > 0 and u["host_peak_mb"] > 0
    # no CUDA here: ZeRO-2 is skipped with its reason (deepspeed missing, or present but CPU-only)
    assert p["zero2"]["status"] == "skipped" and "deepspeed" in p["zero2"]["why"]
    assert p["resume"]["status"] == "ok" and p["resume"]["relative"] <= 1e-3 and p["resume"]["optimizer_steps"] == 8
    assert p["generate"]["status"] == "ok" and p["generate"]["device"] == "cpu" and p["generate"]["rows"] == 4
    assert p["vllm"] == {"status": "skipped", "why": "no CUDA device or no vllm", "seconds": p["vllm"]["seconds"],
                         "limit_s": p["vllm"]["limit_s"]}
    # each part's record was on disk before the summary; the summary file holds the printed line
    records = [json.loads(x) for x in (tmp_path / "out" / "parts.jsonl").read_text().splitlines()]
    assert [r["part"] for r in records] == PARTS
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == out
    assert (tmp_path / "out" / "logs.tgz").stat().st_size > 0
    assert "update1 old log-probs" in res.stderr


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_a_failed_part_and_a_timed_out_part_cost_only_themselves(tmp_path: Path, _offline_caches: None) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    res, out = _check(tmp_path, WHEELS=str(wheels), LIMIT_GENERATE="1", PARTS="install build generate vllm")
    assert res.returncode == 1
    assert out["status"] == "incomplete" and out["not_ok"] == ["generate", "install"]
    p = out["parts"]
    assert p["install"]["status"] == "failed" and any("broken" in line for line in p["install"]["log_tail"])
    assert p["build"]["status"] == "ok"  # after the failed install
    assert p["generate"]["status"] == "timeout" and p["generate"]["limit_s"] == 1  # LIMIT_ wins over DRY's 4x
    assert p["vllm"]["status"] == "skipped"  # after the timed-out part


@pytest.mark.integration
def test_parts_the_budget_cannot_fit_are_skipped_and_reported(tmp_path: Path) -> None:
    res, out = _check(tmp_path, BUDGET_S="1")
    assert res.returncode == 0 and out["status"] == "nothing ran"
    assert list(out["parts"]) == PARTS
    assert all(v["status"] == "skipped" and "BUDGET_S=1" in v["why"] for v in out["parts"].values())


@pytest.mark.integration
def test_a_stopped_check_ends_its_running_part_and_still_reports(tmp_path: Path, _offline_caches: None) -> None:
    work = tmp_path / "w"
    env = {**os.environ, "DRY": "1", "WORK": str(work), "PYTHON": sys.executable, "PARTS": "build generate"}
    proc = subprocess.Popen(["bash", str(REPO / "recipes" / "gpu_check.sh")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (work / "build.log").exists():  # the build part is running
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["parts"]["build"]["status"] == "failed" and "interrupted" in out["parts"]["build"]["why"]
    assert "generate" not in out["parts"]
    left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).count(str(work))]
    assert not left, "the interrupted part left processes behind"


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.unit
def test_missing_wheels_folder_is_a_usage_error(tmp_path: Path) -> None:
    res = subprocess.run(["bash", str(REPO / "recipes" / "gpu_check.sh")], capture_output=True, text=True,
                         env={**os.environ, "WHEELS": str(tmp_path / "nope"), "WORK": str(tmp_path / "w")})
    assert res.returncode == 2 and "nope is not a folder" in res.stderr and res.stdout == ""


@pytest.mark.unit
def test_records_name_timeouts_and_silent_exits(tmp_path: Path) -> None:
    rec = _record_module()
    out, log, said = tmp_path / "out", tmp_path / "p.log", tmp_path / "p.out"
    log.write_text("step 1\nstep 2\n")
    said.write_text("progress\n")
    rec.part(out, "slow", "r1", 124, 60, 60, said, log)
    rec.part(out, "quiet", "r1", 0, 1, 60, said, log)
    said.write_text('progress\n{"tokens_per_s": 5.0}\n')
    rec.part(out, "fine", "r1", 0, 1, 60, said, log)
    with open(out / "parts.jsonl", "a") as f:
        f.write('{"part": "cut", "run": "r1", "sta')  # a kill mid-line: the lines before it still count
    assert rec.summary(out, "r1", {}) == 3
    line = json.loads((out / "summary.json").read_text())
    assert line["not_ok"] == ["quiet", "slow"]
    assert line["parts"]["slow"]["status"] == "timeout" and line["parts"]["slow"]["log_tail"] == ["step 1", "step 2"]
    assert line["parts"]["quiet"]["why"] == "exit 0 but no JSON line on stdout"
    assert line["parts"]["fine"] == {"tokens_per_s": 5.0, "status": "ok", "seconds": 1, "limit_s": 60}
    assert rec.summary(out, "another-run", {}) == 0  # a run gathers its own records only


@pytest.mark.unit
def test_the_wheel_gatherer_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    theirs = tmp_path / "wheels"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    res = subprocess.run([sys.executable, str(REPO / "recipes" / "gpu_check.py"), "wheels", str(theirs)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "was not written by this script" in res.stderr
    assert (theirs / "keep.txt").read_text() == "mine"


@pytest.mark.unit
def test_the_cuda_only_checks_skip_without_cuda(tmp_path: Path) -> None:
    """`smoke` and `vllm` run everywhere and say why they did nothing, so a CI step may call them."""
    for name in ("smoke", "vllm"):
        res = subprocess.run([sys.executable, str(REPO / "recipes" / "gpu_check.py"), name, str(tmp_path / name)],
                             capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert res.returncode == 0, res.stderr[-2000:]
        line = json.loads(res.stdout.strip().splitlines()[-1])
        assert line["status"] == "skipped" and "CUDA" in line["why"], line
