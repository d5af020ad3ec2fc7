"""`spade doctor`: what confinement, GPUs and backends work here, and the sandbox tier in use."""

from __future__ import annotations

import typer

from spade_cli.cli import PANEL_HELPERS, JsonOpt, command, console, emit


def doctor(as_json: JsonOpt = False) -> None:
    """Probe bubblewrap, user namespaces, Landlock, seccomp, cgroups, root, GPUs and the generation
    backends, then say which sandbox tier `validate` and `rollout` will use (and why not stronger).

    Example: [bold]spade doctor[/]   or   [bold]spade doctor --json | jq .tier[/]
    """
    from rich.table import Table

    from spade_cli.backends import probe_backends
    from spade_cli.sandbox.probe import probe_all

    report = {**probe_all(), "backends": probe_backends()}
    if as_json:
        emit(report)
        return
    t = Table(title="spade doctor", title_justify="left")
    for col in ("check", "ok", "detail"):
        t.add_column(col)

    def row(name: str, item: dict) -> None:
        t.add_row(name, "[green]yes[/]" if item.get("ok") else "[red]no[/]", str(item.get("detail", "")))

    row("identity", report["identity"])
    b = report["bubblewrap"]
    row("bubblewrap", {**b, "detail": f"{b.get('path') or '-'} ({b['source']}): {b['detail']}"})
    row("user namespaces", report["user_namespaces"])
    ll = report["landlock"]
    row("landlock", {**ll, "detail": f"ABI {ll['abi']}: {ll['detail']}"})
    for key in ("seccomp", "cgroups", "gpus"):
        row(key, report[key])
    for name, item in report["backends"].items():
        row(f"backend {name}", item)
    tier = report["tier"]
    row("sandbox tier", {"ok": tier["ok"], "detail": tier["tier"] or "none: the sandbox cannot run here"})
    console.print(t)
    for w in tier["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
    emit({"tier": tier["tier"], "warnings": tier["warnings"]})


def register(app: typer.Typer) -> None:
    app.command("doctor", rich_help_panel=PANEL_HELPERS)(command(doctor))
