"""The `spade` command: one typer app; each command lives in ``spade_cli/commands/<name>.py``.

Only typer, rich and spade's light modules are imported here, so ``spade --help`` stays fast;
every command imports torch, transformers, TRL, vLLM, lm-eval or datasets inside its body.
"""

from __future__ import annotations

import importlib

import typer

from spade_cli.cli import SpadeCommand, SpadeGroup

app = typer.Typer(
    name="spade",
    cls=SpadeGroup,
    help="Self-Play in Adaptive Synthetic Executable Environments: design, validate, roll out, "
    "score and update, one stage per command, files in between.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

# The order of `spade --help`: the loop's stages in pipeline order, then the helpers.
COMMANDS = ["design", "validate", "rollout", "regret", "update", "eval",
            "serve", "prune", "warmstart", "init_model", "doctor", "inspect", "paths", "plan", "report", "compare"]

for _name in COMMANDS:
    importlib.import_module(f"spade_cli.commands.{_name}").register(app)
# Every command renders its help through SpadeCommand (short metavars, reflowed docstrings).
for _info in app.registered_commands:
    _info.cls = SpadeCommand


def main() -> None:
    app()
