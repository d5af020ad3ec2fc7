"""`spade report --report-to`: each iteration's figures to the experiment trackers a user names.

The figures are the report's own rows (``spade_cli.reporting.iterations.iteration_row``: validity, returns, regret,
Vendi, the curriculum diagnostics, ``update.*``, ``eval:*``), under the column names of
``iterations.csv``, with the iteration as the step, as TRL's ``report_to`` sends a trainer's logs:

- ``tensorboard``: event files in ``RUN/report/tensorboard/`` (``tensorboard --logdir runs/``);
- ``wandb``: one W&B run per spade run, resumed by the id kept in ``tracked.json``; its files under
  ``$WANDB_DIR`` or ``RUN/report/``, and ``WANDB_MODE=offline`` works as everywhere;
- ``trackio``: the local trackio database (``$TRACKIO_DIR``, else trackio's default).

A row is sent once the update that closes its iteration exists (``ckpt/iter_{i+1}/update.json``):
before that, a rollout still being sharded or a curriculum figure would change after it was sent.
A row with no iteration directory (the eval of a checkpoint no iteration has played yet, such as
the final one) holds only eval figures, which are final, and is sent as soon as it exists; what its
iteration adds later is sent then, at the same step. What went to which tracker is kept in
``RUN/report/tracked.json`` (written atomically after each tracker has flushed), so the loop can
call ``spade report RUN --report-to ...`` after every iteration and a rerun sends only what is new.
A kill between a tracker's flush and that write sends those rows again on the next call.

Each tracker's library is an optional extra (``pip install 'spade[tensorboard]'``, ``[wandb]``,
``[trackio]``), imported only when named.

    spade report runs/demo --no-plots --report-to tensorboard,wandb
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import sys
import uuid
from typing import Any

from spade_cli.core.artifacts import SpadeError, atomic_write_text
from spade_cli.core.errors import UsageError
from spade_cli.core.layout import RunLayout

TRACKERS = ("tensorboard", "wandb", "trackio")  # each the name of its package and of spade's extra


def parse_report_to(value: str | None) -> list[str]:
    """``"tensorboard,wandb"`` -> the trackers named, in order; ``none`` or empty -> []."""
    names = [n.strip().lower() for n in (value or "").split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise UsageError(f"--report-to {value}: unknown tracker {', '.join(unknown)}; "
                         f"name some of {', '.join(TRACKERS)} (comma-separated) or none")
    return list(dict.fromkeys(names))


def check_installed(trackers: list[str]) -> None:
    """Before any work: a tracker whose library is missing is named with the extra that installs it."""
    for name in trackers:
        if importlib.util.find_spec(name) is None:
            raise SpadeError(f"--report-to {name}: the {name} package is not installed; "
                             f"pip install 'spade[{name}]'")


def scalars(row: dict) -> dict[str, float]:
    """The row's numbers, a dict cell's entries as ``column/key`` (``invalid_reasons/trivial``);
    the iteration is the step, not a figure, and booleans and non-finite values are no figures."""
    out: dict[str, float] = {}

    def add(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{key}/{k}", v)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = value

    for key, value in row.items():
        if key != "iteration":
            add(key, value)
    return out


def _closed(layout: RunLayout, i: int, played: set[int]) -> bool | None:
    """True when iteration i's update exists (the row is final); None when the row is an eval of a
    checkpoint no iteration has played (only final figures, more may come); False otherwise."""
    if (layout.ckpt(i + 1) / "update.json").exists():
        return True
    return None if i not in played else False


def due(layout: RunLayout, rows: list[dict], state: dict) -> list[tuple[int, dict[str, float], bool]]:
    """(iteration, figures not yet sent, closed) for one tracker's ``state`` (``done``: iterations
    sent closed; ``early``: iteration -> keys sent before it closed)."""
    done, early = set(state.get("done", [])), state.get("early", {})
    played = set(layout.iterations())
    out = []
    for row in sorted(rows, key=lambda r: r["iteration"]):
        i = row["iteration"]
        closed = _closed(layout, i, played)
        if i in done or closed is False:
            continue
        sent = set(early.get(str(i), []))
        figures = {k: v for k, v in scalars(row).items() if k not in sent}
        if figures or closed:
            out.append((i, figures, bool(closed)))
    return out


def _record(state: dict, sent: list[tuple[int, dict[str, float], bool]]) -> dict:
    done, early = set(state.get("done", [])), dict(state.get("early", {}))
    for i, figures, closed in sent:
        if closed:
            done.add(i)
            early.pop(str(i), None)
        else:
            early[str(i)] = sorted(set(early.get(str(i), [])) | set(figures))
    return {**state, "done": sorted(done), "early": early}


# -- the trackers ------------------------------------------------------------------------------------

def _tensorboard(layout: RunLayout, steps: list, state: dict, project: str, name: str) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    logdir = layout.report_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(logdir))
    try:
        for i, figures, _ in steps:
            for key, value in figures.items():
                writer.add_scalar(key, value, global_step=i)
        writer.flush()
    finally:
        writer.close()
    return {**state, "logdir": str(logdir)}


def _wandb(layout: RunLayout, steps: list, state: dict, project: str, name: str) -> dict:
    import os

    import wandb

    run_id = state.get("id") or uuid.uuid4().hex[:12]  # kept, so every call resumes the same W&B run
    run = wandb.init(project=project, name=name, id=run_id, resume="allow",
                     dir=os.environ.get("WANDB_DIR") or str(layout.report_dir), config=_config(layout))
    try:
        # the iteration is the x-axis, so figures an iteration adds after its eval go to its own step
        run.define_metric("iteration")
        run.define_metric("*", step_metric="iteration")
        for i, figures, _ in steps:
            run.log({"iteration": i, **figures})
    finally:
        run.finish()
    return {**state, "id": run_id, "project": project}


def _trackio(layout: RunLayout, steps: list, state: dict, project: str, name: str) -> dict:
    import trackio

    trackio.init(project=project, name=name, resume="allow", config=_config(layout))
    try:
        for i, figures, _ in steps:
            trackio.log(figures, step=i)
    finally:
        trackio.finish()
    return {**state, "project": project, "name": name}


SENDERS = {"tensorboard": _tensorboard, "wandb": _wandb, "trackio": _trackio}


def _config(layout: RunLayout) -> dict:
    """The run's resolved settings (``settings.json``, written by recipes/experiment.sh) when it has them."""
    config: dict[str, Any] = {"run_dir": str(layout.root)}
    with contextlib.suppress(OSError, ValueError):
        settings = json.loads((layout.root / "settings.json").read_text())
        if isinstance(settings, dict):
            config.update(settings)
    return config


def send(layout: RunLayout, rows: list[dict], trackers: list[str], project: str = "spade",
         name: str | None = None) -> dict:
    """Send what each tracker has not had yet; returns per tracker the iterations sent now."""
    path = layout.report_dir / "tracked.json"
    try:
        tracked = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        tracked = {}  # unreadable: sending again is the safe side (a repeat, never a gap)
    name = name or str(layout.root)
    out = {}
    for tracker in trackers:
        state = tracked.get(tracker, {})
        steps = due(layout, rows, state)
        if steps:
            # the trackers' banners go to stderr: stdout carries spade's one JSON line
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    state = SENDERS[tracker](layout, steps, state, project, name)
            except Exception as exc:  # the tracker's own failure (no W&B login, a locked database): named
                raise SpadeError(f"--report-to {tracker}: {type(exc).__name__}: {exc} "
                                 f"(sent before: {path})") from exc
            tracked[tracker] = _record(state, steps)
            atomic_write_text(path, json.dumps(tracked, indent=1) + "\n")
        out[tracker] = {"sent": [i for i, _, _ in steps], "tracked": str(path)}
    return out
