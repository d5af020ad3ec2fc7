"""`spade inspect`: a readable view of any spade artifact."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, JsonOpt, command, console, emit


def _table(title: str, rows: dict) -> None:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_header=False)
    for k, v in rows.items():
        t.add_row(str(k), f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(t)


def _show_row(path: str, line: int, row: dict) -> None:
    from rich.panel import Panel
    from rich.syntax import Syntax

    long = {k: row[k] for k in ("code", "completion", "hint") if isinstance(row.get(k), str)}
    rest = {k: v for k, v in row.items() if k not in long and k not in ("tokens",)}
    if isinstance(row.get("tokens"), dict):
        rest["tokens"] = {k: (f"[{len(v)} items]" if isinstance(v, list) else v)
                          for k, v in row["tokens"].items()}
    console.print(f"[bold]{path}:{line}[/]")
    console.print_json(json.dumps(rest, default=str))
    if "hint" in long:
        console.print(Panel(long["hint"], title="hint"))
    if "code" in long:
        console.print(Panel(Syntax(long["code"], "python", line_numbers=True), title="code"))
    elif "completion" in long:
        console.print(Panel(long["completion"], title="completion"))


def inspect(
    files: Annotated[list[str], typer.Argument(help="Artifact files or globs (e.g. 'rollouts*.jsonl').")],
    row: Annotated[int | None, typer.Option("--row", help="Pretty-print record N (0-based).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Summarise spade artifacts: rows per schema, valid rate and reasons, returns, regret, tokens.

    Example: [bold]spade inspect runs/demo/iter_0000/validated.jsonl --row 3[/]
    """
    from spade_cli import summary

    if row is not None:
        found = summary.nth_row(files, row)
        if found is None:
            from spade_cli.artifacts import SpadeError

            raise SpadeError(f"there is no row {row} in {', '.join(files)}")
        path, line, rec = found
        if as_json:
            emit(rec)
        else:
            _show_row(str(path), line, rec)
        return
    info = summary.summarize(files)
    if as_json:
        emit(info)
        return
    _table("artifact", {"rows": info["rows"], "environments": info["envs"],
                        **{f"schema {k}": v for k, v in info["schemas"].items()}})
    if "valid" in info:
        _table("validation", {"valid": info["valid"], "valid rate": info["valid_rate"],
                              **{f"invalid: {k}": v for k, v in info["invalid_reasons"].items()}})
    for key in ("returns",):
        for side, d in (info.get(key) or {}).items():
            if d:
                _table(f"{side} returns", d)
    if info.get("episode_errors"):
        _table("episode errors", info["episode_errors"])
    for key in ("regret", "designer_reward", "tokens"):
        if info.get(key):
            _table(key.replace("_", " "), info[key])
    for e in info.get("eval", []):
        _table(f"eval {e['task']}", e)


def register(app: typer.Typer) -> None:
    app.command("inspect", rich_help_panel=PANEL_HELPERS)(command(inspect))
