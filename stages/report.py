"""`spade report`: one row per iteration of a run, as CSV, JSONL and PNG plots.

Input: a run directory (``spade_cli.core.layout.RunLayout``); what each row holds and where it is
read from is in ``spade_cli.reporting.iterations``, which ``spade compare`` reads too. Only
finished artifacts count, and a run that is still going (or died) reports what it has.

Output, in ``RUN_DIR/report/``: ``iterations.csv``, ``iterations.jsonl``, ``top_regret.csv`` (the
highest-regret envs of each iteration with their audit flags) and PNG plots (returns, validity,
diversity, update, eval, labels, regret, frontier), each written only when it has data. With
``report_to``, the finished iterations also go to TensorBoard, W&B or trackio, each once
(``stages.report_track``).

    spade report runs/demo
"""

from __future__ import annotations

import json
from pathlib import Path

from spade_cli.core.artifacts import atomic_write_text
from spade_cli.core.layout import RunLayout
from spade_cli.reporting.iterations import (  # noqa: F401  (engine_events, iteration_row: re-exported)
    columns_of,
    engine_events,
    iteration_row,
    iterations,
    to_csv,
    write_plots,
)
from stages import report_track


def run(run_dir: str | Path, plots: bool = True, report_to: str | list[str] | None = None, project: str = "spade",
        run_name: str | None = None) -> dict:
    """Build the per-iteration table and its files, send the finished iterations to the trackers in
    ``report_to`` (``"tensorboard,wandb"`` or a list, as TRL takes it; ``stages.report_track``);
    returns the summary (rows included)."""
    from spade_cli.core.artifacts import SpadeError

    layout = RunLayout(Path(run_dir))
    if not layout.root.is_dir():
        raise SpadeError(f"{run_dir}: not a directory")
    report_to = report_track.parse_report_to(report_to if isinstance(report_to, str | None) else ",".join(report_to))
    report_track.check_installed(report_to)
    its = iterations(layout)
    if not its:
        raise SpadeError(f"{run_dir}: no iter_XXXX directories, eval files or checkpoints: is this a run directory?")
    out_dir = layout.report_dir
    rows = [iteration_row(layout, i, out_dir / ".cache") for i in its]
    engine = engine_events(layout)  # outside the cache: events.jsonl grows while the run goes on
    for r in rows:
        r.update(engine.get(r["iteration"], {}))
    # the highest-regret envs of each iteration with their audit flags: where a bought reward shows
    top = [{"iteration": r["iteration"], **t} for r in rows for t in r.pop("top_regret", [])]
    atomic_write_text(out_dir / "top_regret.csv",
                      to_csv(top, ["iteration", "env_id", "regret", "designer_reward", "flags"]))
    columns = columns_of(rows)
    atomic_write_text(out_dir / "iterations.csv", to_csv(rows, columns))
    atomic_write_text(out_dir / "iterations.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    written = []
    if plots:
        written = write_plots(rows, out_dir)
    tracked = report_track.send(layout, rows, report_to, project, run_name) if report_to else {}
    return {"status": "ok", "run_dir": str(layout.root), "iterations": len(rows), "first": its[0], "last": its[-1],
            "csv": str(out_dir / "iterations.csv"), "jsonl": str(out_dir / "iterations.jsonl"),
            "top_regret": str(out_dir / "top_regret.csv"),
            "plots": [str(p) for p in written], **({"report_to": tracked} if tracked else {}),
            "columns": columns, "rows": rows}
