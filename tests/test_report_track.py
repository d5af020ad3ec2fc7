"""`spade report --report-to`: the report's figures in TensorBoard, W&B (offline) and trackio (local),
read back with each tracker's own reader, each iteration sent once (stages/report_track.py).

The run is test_report.py's: iteration 0 closed by its update, iteration 1 still open (no update
yet), and an eval of checkpoint 2 that no iteration has played. A tracker whose package is absent
skips its test with the extra to install.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from tests.conftest import run_spade
from tests.test_report import run_dir  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


def _report(run: Path, *flags: str, env: dict | None = None) -> dict:
    proc = run_spade("report", run, "--no-plots", *flags, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # the trackers' banners went to stderr
    return json.loads(lines[0])


def _close_iteration_1(run: Path) -> None:
    upd = run / "ckpt" / "iter_0002" / "update.json"
    upd.parent.mkdir(parents=True)
    upd.write_text(json.dumps({"metrics": {"loss": 0.25, "entropy": 1.5}}))


# -- which rows are due, without any tracker --------------------------------------------------------------

@pytest.mark.unit
def test_closed_rows_once_eval_rows_early_and_figures_flattened(run_dir: Path) -> None:  # noqa: F811
    from spade_cli.core.layout import RunLayout
    from stages import report, report_track

    layout = RunLayout(run_dir)
    rows = [report.iteration_row(layout, i) for i in report.iterations(layout)]
    first = report_track.due(layout, rows, {})
    assert [(i, closed) for i, _, closed in first] == [(0, True), (2, False)]  # 1 waits for its update
    figures = first[0][1]
    assert figures["valid"] == 2 and figures["invalid_reasons/trivial"] == 1 and figures["update.loss"] == 0.125
    assert figures["eval:rg:basic_arithmetic/score"] == 0.2 and "iteration" not in figures
    assert first[1][1] == {"eval:rg:basic_arithmetic/score": 0.4}
    state = report_track._record({}, first)
    assert state == {"done": [0], "early": {"2": ["eval:rg:basic_arithmetic/score"]}}
    assert report_track.due(layout, rows, state) == []  # nothing new: nothing sent again
    _close_iteration_1(run_dir)
    rows = [report.iteration_row(layout, i) for i in report.iterations(layout)]
    again = report_track.due(layout, rows, state)
    assert [(i, closed) for i, _, closed in again] == [(1, True)] and again[0][1]["update.loss"] == 0.25


@pytest.mark.unit
def test_names_a_missing_tracker_with_its_extra_and_refuses_an_unknown_one(run_dir: Path, monkeypatch) -> None:  # noqa: F811
    from spade_cli.core.errors import SpadeError, UsageError
    from stages import report, report_track

    assert report_track.parse_report_to("none") == [] and report_track.parse_report_to(None) == []
    assert report_track.parse_report_to("wandb, tensorboard,wandb") == ["wandb", "tensorboard"]
    with pytest.raises(UsageError, match="unknown tracker mlflow; name some of tensorboard, wandb, trackio"):
        report_track.parse_report_to("tensorboard,mlflow")
    monkeypatch.setattr(report_track.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpadeError, match=r"--report-to wandb: the wandb package is not installed; "
                                         r"pip install 'spade\[wandb\]'"):
        report.run(run_dir, plots=False, report_to="wandb")
    assert not (run_dir / "report").exists()  # refused before any work
    proc = run_spade("report", run_dir, "--report-to", "mlflow")
    assert proc.returncode == 2 and "unknown tracker mlflow" in proc.stderr


# -- TensorBoard -------------------------------------------------------------------------------------------

def test_tensorboard_event_files_hold_each_iteration_once(run_dir: Path) -> None:  # noqa: F811
    pytest.importorskip("tensorboard", reason="pip install 'spade[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _report(run_dir, "--report-to", "tensorboard")
    assert out["report_to"]["tensorboard"]["sent"] == [0, 2]
    assert _report(run_dir, "--report-to", "tensorboard")["report_to"]["tensorboard"]["sent"] == []
    _close_iteration_1(run_dir)
    assert _report(run_dir, "--report-to", "tensorboard")["report_to"]["tensorboard"]["sent"] == [1]

    acc = EventAccumulator(str(run_dir / "report" / "tensorboard"))
    acc.Reload()

    def points(tag: str) -> list[tuple[int, float]]:
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]

    assert points("eval:rg:basic_arithmetic/score") == [(0, 0.2), (2, 0.4)]  # once each, over three calls
    assert points("update.loss") == [(0, 0.125), (1, 0.25)]
    assert points("valid") == [(0, 2.0), (1, 1.0)] and points("invalid_reasons/trivial") == [(0, 1.0), (1, 1.0)]
    assert points("unhinted_mean") == [(0, 0.25)] and points("hinted_mean") == [(0, 0.75)]
    tracked = json.loads((run_dir / "report" / "tracked.json").read_text())
    assert tracked["tensorboard"]["done"] == [0, 1] and tracked["tensorboard"]["early"] == {
        "2": ["eval:rg:basic_arithmetic/score"]}


# -- W&B, offline -------------------------------------------------------------------------------------------

def _wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline run's .wandb file (a LevelDB-format log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, rows = run_file.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_offline_run_holds_the_figures_and_a_rerun_resumes_it(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("wandb", reason="pip install 'spade[wandb]'")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb_dir"),
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache")}
    (tmp_path / "wandb_dir").mkdir()
    (run_dir / "settings.json").write_text(json.dumps({"MODEL": "ckpt/tiny", "K": 4}))
    assert _report(run_dir, "--report-to", "wandb", "--project", "p", env=env)["report_to"]["wandb"]["sent"] == [0, 2]
    _close_iteration_1(run_dir)
    assert _report(run_dir, "--report-to", "wandb", "--project", "p", env=env)["report_to"]["wandb"]["sent"] == [1]

    run_id = json.loads((run_dir / "report" / "tracked.json").read_text())["wandb"]["id"]
    files = sorted((tmp_path / "wandb_dir" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) >= 1  # both calls wrote to the W&B run of this spade run
    history = [row for f in files for row in _wandb_history(f)]
    by_iteration = {row["iteration"]: row for row in history}
    assert sorted(by_iteration) == [0, 1, 2] and len(history) == 3  # each iteration once
    assert by_iteration[0]["update.loss"] == 0.125 and by_iteration[0]["valid"] == 2
    assert by_iteration[0]["invalid_reasons/trivial"] == 1 and by_iteration[1]["update.loss"] == 0.25
    assert by_iteration[2] == {"iteration": 2, "eval:rg:basic_arithmetic/score": 0.4,
                               **{k: v for k, v in by_iteration[2].items() if k.startswith("_")}}


# -- trackio, local -----------------------------------------------------------------------------------------

def test_trackio_local_database_holds_the_figures(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("trackio", reason="pip install 'spade[trackio]'")
    env = {"TRACKIO_DIR": str(tmp_path / "trackio")}
    assert _report(run_dir, "--report-to", "trackio", "--project", "p", "--run-name", "demo",
                   env=env)["report_to"]["trackio"]["sent"] == [0, 2]
    assert _report(run_dir, "--report-to", "trackio", "--project", "p", "--run-name", "demo",
                   env=env)["report_to"]["trackio"]["sent"] == []
    _close_iteration_1(run_dir)
    assert _report(run_dir, "--report-to", "trackio", "--project", "p", "--run-name", "demo",
                   env=env)["report_to"]["trackio"]["sent"] == [1]

    with sqlite3.connect(tmp_path / "trackio" / "p.db") as db:
        logged = [(step, name, json.loads(metrics)) for step, name, metrics in
                  db.execute("SELECT step, run_name, metrics FROM metrics ORDER BY step")]
    assert [(step, name) for step, name, _ in logged] == [(0, "demo"), (1, "demo"), (2, "demo")]
    assert logged[0][2]["update.loss"] == 0.125 and logged[0][2]["invalid_reasons/trivial"] == 1
    assert logged[1][2]["update.loss"] == 0.25 and logged[2][2] == {"eval:rg:basic_arithmetic/score": 0.4}
