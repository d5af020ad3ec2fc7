"""`spade inspect`: a readable view of any spade artifact.

The numbers come from ``spade_cli.summary`` (a pure module); this file only turns them into rich
tables on stderr, or one JSON object on stdout with ``--json``. ``--where KEY=VALUE`` narrows the
rows first, ``--row N`` shows the N-th of them in full.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from spade_cli.cli import PANEL_HELPERS, JsonOpt, command, console, emit


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else str(v)


def _pairs(title: str, rows: dict) -> None:
    """A two-column table of name -> value; nothing when there is nothing to say."""
    from rich.table import Table

    rows = {k: v for k, v in rows.items() if v not in (None, {}, [])}
    if not rows:
        return
    # min_width: a title wider than its table would otherwise wrap into a column of words
    t = Table(title=title, title_justify="left", show_header=False, min_width=len(title) + 4)
    for k, v in rows.items():
        t.add_row(str(k), _fmt(v))
    console.print(t)


def _grid(title: str, header: list[str], rows: list[list[Any]], limit: int = 10) -> None:
    """A table with a header row; long lists are cut to ``limit`` rows with a note saying so."""
    from rich.table import Table

    if not rows:
        return
    t = Table(title=title, title_justify="left", min_width=len(title) + 4)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows[:limit]:
        t.add_row(*map(_fmt, r))
    if len(rows) > limit:
        t.caption = f"{limit} of {len(rows)} shown; --json has them all"
    console.print(t)


def _dist(title: str, d: dict | None) -> None:
    if d:
        _pairs(title, d)


def _show_designs(d: dict) -> None:
    _pairs("designs", {"rows": d["rows"], "parsed": d["parsed"], "failed to parse": d["failed"],
                       **{f"finish: {k}": v for k, v in d["finish_reasons"].items()}})
    _pairs("parse errors by kind", d["parse_errors"])
    groups = sorted(d["by_group"].items(), key=lambda kv: (-kv[1]["failed"], kv[0]))
    _grid("per prompt group", ["group_id", "doc", "designs", "failed"],
          [[g, v["doc_id"], v["rows"], v["failed"]] for g, v in groups])
    docs = sorted(d["by_doc"].items(), key=lambda kv: (-kv[1]["failed"], kv[0]))
    _grid("per grounding document", ["doc", "designs", "failed"], [[k, v["rows"], v["failed"]] for k, v in docs])
    _dist("completion tokens", d["completion_tokens"])
    _dist("completion characters", d["completion_chars"])


def _show_validation(v: dict) -> None:
    _pairs("validation", {"rows": v["rows"], "valid": v["valid"], "invalid": v["invalid"],
                          "valid rate": v["valid_rate"]})
    _pairs("invalid by reason", v["reasons"])
    _pairs("parse errors by kind", v["parse_errors"])
    _pairs("checks that failed most", v["failed_checks"])
    _dist("env step time p50 (ms)", v["step_ms_p50"])


def _show_rollouts(r: dict) -> None:
    _pairs("rollouts", {"episodes": r["episodes"], "envs": r["envs"],
                        **{f"ended: {k}": n for k, n in r["ends"].items()}})
    for side in ("unhinted", "hinted"):
        _dist(f"{side} returns", r[side])
    _pairs("episode errors", r["errors"])
    _dist("turns per episode", r["turns"])
    envs = sorted(r["per_env"].items(), key=lambda kv: (-(kv[1]["gap"] or 0.0), kv[0]))
    _grid("returns per env (largest hinted - unhinted first)",
          ["env_id", "unhinted", "hinted", "gap", "episodes", "errors"],
          [[e, v["unhinted_mean"], v["hinted_mean"], v["gap"], v["unhinted_n"] + v["hinted_n"], v["errors"]]
           for e, v in envs])


def _show_scores(s: dict) -> None:
    _pairs("scores", {"rows": s["rows"], "flagged": s["flagged"]})
    _dist("regret", s["regret"])
    _dist("designer reward", s["designer_reward"])
    _pairs("audit flags", s["flags"])
    _grid("top environments by designer reward", ["env_id", "reward", "regret", "±ci95", "unhinted", "hinted", "flags"],
          [[t["env_id"], t["designer_reward"], t["regret"], t["regret_ci95"], t["unhinted_mean"],
            t["hinted_mean"], ",".join(t["flags"]) or None] for t in s["top"]])


def _show_memory(m: dict) -> None:
    _pairs("memory", {"environments": m["envs"], "learnable": m["learnable"], "solved (too easy)": m["solved"],
                      **{f"label: {k}": n for k, n in m["labels"].items() if k not in ("learnable", "too easy")}})
    _dist("history length (iterations)", m["history_len"])
    _pairs("memory flags", m["flags"])


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
    row: Annotated[int | None, typer.Option("--row", metavar="N", help="Show record N (0-based, among the "
                                            "rows --where keeps) in full.")] = None,
    where: Annotated[list[str] | None, typer.Option(
        "--where", metavar="KEY=VALUE", help="Keep rows whose KEY (dots for nested: doc.id) equals VALUE "
        "(text or JSON: reason=trivial, hinted=true); repeat to AND.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Summarise spade artifacts: what each file is read for, per schema.

    Designs: parsed vs failed, parse errors by kind, per group and document. Validation: reasons and
    failed checks. Rollouts: returns hinted/unhinted per env, errors, turns. Scores: regret, flags,
    top envs. Memory: learnable/solved. Tokens per role (Designer, Agent).

    Example: [bold]spade inspect 'rollouts*.jsonl' --where hinted=false --row 0[/]
    """
    from spade_cli import summary
    from spade_cli.core.artifacts import SpadeError

    try:
        cond = summary.parse_where(where or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--where") from None
    if row is not None:
        found = summary.nth_row(files, row, cond)
        if found is None:
            kept = f" matching {' and '.join(where or [])}" if cond else ""
            raise SpadeError(f"there is no row {row}{kept} in {', '.join(files)}")
        path, line, rec = found
        if as_json:
            emit({"file": str(path), "line": line, "row": rec})
        else:
            _show_row(str(path), line, rec)
        return
    info = summary.summarize(files, cond)
    if as_json:
        emit(info)
        return
    _pairs("artifact", {"rows": info["rows"], "environments": info["envs"],
                        **{f"where {k}": v for k, v in (info.get("where") or {}).items()},
                        **{f"schema {k}": v for k, v in info["schemas"].items()}})
    for key, show in (("designs", _show_designs), ("validation", _show_validation),
                      ("rollouts", _show_rollouts), ("scores", _show_scores), ("memory", _show_memory)):
        if key in info:
            show(info[key])
    tokens = info.get("tokens") or {}
    _grid("tokens by role", ["role", "prompt", "completion", "generated", "env"],
          [[role, t["prompt"], t["completion"], t.get("agent", t["completion"]), t.get("env")]
           for role, t in tokens.items()])
    for e in info.get("eval", []):
        _pairs(f"eval {e['task']}", e)


def register(app: typer.Typer) -> None:
    app.command("inspect", rich_help_panel=PANEL_HELPERS)(command(inspect))
