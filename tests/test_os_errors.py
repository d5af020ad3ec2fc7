"""An operating-system error reaches the user as one line naming the path, exit 1, never a traceback.

Disk full is made for real: a small tmpfs (root only; skipped elsewhere) under `spade validate` and
`spade update`, and a file size limit (``RLIMIT_FSIZE``, any user) under `spade validate`. Each run
keeps what it finished, and the rerun after room is made completes it. The handler stays narrow: an
exception that is no OSError (nor a weight saver's stand-in for one) is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spade_cli.cli import command
from spade_cli.core.errors import describe_os_error, os_error_of
from tests.conftest import WIDE, run_spade

BENIGN_DIR = Path(__file__).parent / "envs_benign"


def _one_line(res: subprocess.CompletedProcess, message: str) -> None:
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and 'File "' not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), res.stderr


def _designs(path: Path) -> Path:
    """Twelve designs whose validation rows (about 2.6 kB each) outgrow 16 kB."""
    hints = json.loads((BENIGN_DIR / "hints.json").read_text())
    rows = [{"schema": "spade.design/1", "code": (BENIGN_DIR / name).read_text() + f"\n# copy {i}\n",
             "hint": hint} for i in range(3) for name, hint in hints.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _verdicts(path: Path) -> list[tuple]:
    return [(r["env_id"], r["valid"], r["reason"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 12 MB tmpfs (filled to size by each test), mounted for the test and unmounted after it (needs root)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def _fill(fs: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free on ``fs``."""
    filler = fs / "filler"
    filler.write_bytes(b"\0" * max(0, shutil.disk_usage(fs).free - leave))
    return filler


@pytest.mark.integration
def test_validate_on_a_full_disk_names_the_file_and_resumes(tmp_path: Path, small_fs: Path) -> None:
    designs = _designs(tmp_path / "designs.jsonl")
    whole = tmp_path / "whole.jsonl"
    assert run_spade("validate", "--designs", designs, "--out", whole, "--workers", "1").returncode == 0
    out = small_fs / "validated.jsonl"
    filler = _fill(small_fs, 16 << 10)
    res = run_spade("validate", "--designs", designs, "--out", out, "--workers", "1")
    _one_line(res, rf"error: {re.escape(str(out))}\.partial-\w+: No space left on device \(ENOSPC\); make room "
                   "and rerun the same command")
    assert not out.exists()  # nothing published, the finished rows kept in the partial
    (partial,) = small_fs.glob("validated.jsonl.partial-*")
    assert partial.stat().st_size > 0
    filler.unlink()
    res = run_spade("validate", "--designs", designs, "--out", out, "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["resumed"] > 0
    assert _verdicts(out) == _verdicts(whole)


@pytest.mark.integration
def test_a_disk_already_full_names_the_lock_and_leaves_none(tmp_path: Path, small_fs: Path) -> None:
    _fill(small_fs, 0)
    out = small_fs / "validated.jsonl"
    res = run_spade("validate", "--designs", _designs(tmp_path / "designs.jsonl"), "--out", out)
    _one_line(res, rf"error: {re.escape(str(out))}\.lock: No space left on device \(ENOSPC\)")
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]


@pytest.mark.integration
def test_update_on_a_full_disk_is_one_line_and_the_rerun_completes(tiny_model: Path, tmp_path: Path,
                                                                   small_fs: Path) -> None:
    from tests.test_update import make_artifacts

    paths = make_artifacts(tmp_path, tiny_model)
    argv = ["update", "--model", tiny_model, "--envs", paths["validated"], "--rollouts", paths["rollouts"],
            "--scores", paths["scores"], "--out", small_fs / "ck"]
    # about 6 MB to write (weights twice, the optimizer's moments): the optimizer's file fails
    filler = _fill(small_fs, 3 << 20)
    _one_line(run_spade(*argv), rf"error: {re.escape(str(small_fs / 'ck'))}: No space left on device \(ENOSPC\)")
    assert not (small_fs / "ck").exists() and not (small_fs / "ck.manifest.json").exists()
    filler.unlink()
    res = run_spade(*argv)
    assert res.returncode == 0, res.stderr
    assert (small_fs / "ck" / "model.safetensors").is_file() and (small_fs / "ck.manifest.json").is_file()


@pytest.mark.integration
def test_a_file_size_limit_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """RLIMIT_FSIZE needs no privilege: writes past it fail with EFBIG (Python ignores SIGXFSZ)."""
    designs = _designs(tmp_path / "designs.jsonl")
    out = tmp_path / "validated.jsonl"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))

    res = subprocess.run([sys.executable, "-m", "spade_cli", "validate", "--designs", str(designs), "--out", str(out),
                          "--workers", "1"], capture_output=True, text=True, preexec_fn=limit,
                         env={**os.environ, **WIDE}, timeout=300)
    _one_line(res, rf"error: {re.escape(str(out))}\.partial-\w+: File too large \(EFBIG\); raise the file size "
                   "limit")
    res = run_spade("validate", "--designs", designs, "--out", out, "--workers", "1")
    assert res.returncode == 0 and json.loads(res.stdout)["resumed"] > 0, res.stderr


def _invoke(exc: BaseException, **kwargs: object):
    def boom(out: str = "o") -> None:
        raise exc

    app = typer.Typer()
    app.command()(command(boom))
    return CliRunner().invoke(app, [f"--out={kwargs.get('out', 'o')}"])


@pytest.mark.unit
@pytest.mark.parametrize("exc, line", [
    (PermissionError(errno.EACCES, "Permission denied", "/data/run/scores.jsonl"),
     "error: /data/run/scores.jsonl: Permission denied (EACCES)\n"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "a.jsonl"),
     "error: a.jsonl: No such file or directory (ENOENT)\n"),
    (OSError(errno.EROFS, "Read-only file system", "x", None, "y"), "error: x -> y: Read-only file system (EROFS)\n"),
])
def test_an_os_error_is_one_line_with_its_path(exc: OSError, line: str) -> None:
    res = _invoke(exc)
    assert (res.exit_code, res.output) == (1, line)


@pytest.mark.unit
def test_a_bug_keeps_its_traceback() -> None:
    for exc in (ValueError("a bug"), RuntimeError("also a bug"), KeyError("k")):
        res = _invoke(exc)
        assert res.exit_code == 1 and res.exception is exc and "error:" not in res.output


@pytest.mark.unit
def test_a_weight_savers_write_errors_are_os_errors(tmp_path: Path) -> None:
    import torch
    from safetensors import SafetensorError

    err = os_error_of(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                      "run/ck")
    assert (err.errno, describe_os_error(err).split(";")[0]) == (errno.ENOSPC, "run/ck: No space left on device (ENOSPC)")
    assert os_error_of(SafetensorError("Error while deserializing header: MetadataIncompleteBuffer")) is None

    # torch.save to a file past the size limit: the C++ writer's RuntimeError, with no errno
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 10, hard))
    try:
        torch.save({"w": torch.zeros(4096)}, tmp_path / "w.pt")
    except RuntimeError as exc:
        saved = exc
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    # the output's filesystem has room: a failed save with the library's words, named, no traceback
    err = os_error_of(saved, tmp_path / "ck")
    assert err is not None and err.errno is None and str(tmp_path / "ck") in describe_os_error(err)
    try:
        torch.load(tmp_path / "none.pt")
    except OSError as exc:  # torch.load raises FileNotFoundError itself: already an OSError
        assert os_error_of(exc) is exc
    bug = RuntimeError("unexpected pos 1 vs 2")  # the same words raised elsewhere: no OSError
    assert os_error_of(bug, tmp_path) is None
