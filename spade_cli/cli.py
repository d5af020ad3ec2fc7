"""What every command shares: option aliases, the YAML config, the summary line, errors.

Commands are thin: they declare options with the aliases below, call one ``stages.<stage>.run``
and hand its summary to ``finish``. ``--config FILE.yaml`` is an eager option whose callback loads
a flat mapping into click's ``default_map``, so a flag given on the command line always wins over
the file and the file wins over the defaults in code. Unknown keys in the file are a usage error
(exit 2) rather than silently ignored.

Exit codes (docs/architecture.md, 'Command conventions'): 0 success, 2 usage error (typer/click), 1 anything else.
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import typer.rich_utils
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup, TyperOption

console = Console(stderr=True, highlight=False)

PANEL_LOOP = "The loop"
PANEL_HELPERS = "Helpers"

# The commands that load torch (a model, a trainer or the diversity embedding): the ones whose
# help lists --threads.
TORCH_COMMANDS = {"design", "rollout", "regret", "update", "eval", "warmstart", "init-model"}
# Options that change how a stage runs, not what it produces: left out of the manifest comparison.
NON_SEMANTIC = {"config", "force", "workers", "quiet", "log_every", "threads",
                # vLLM engine options (spade_cli/backends/engine.py): recorded under the manifest's "engine"
                "tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "max_model_len",
                "enable_prefix_caching", "enforce_eager", "engine_arg",
                "foreign_server"}  # recorded under the manifest's "server"


def config_keys(command: Any) -> dict[str, str]:
    """The keys a ``--config`` file may give for ``command``, ``{key: parameter}``: an option's name
    without its leading dashes (``max-tokens``), or with underscores (``max_tokens``), which is the
    parameter's own name: a setting is named alike as a flag, a key and in the manifest."""
    keys: dict[str, str] = {}
    for p in command.params:
        if p.name == "config":
            continue
        names = [o[2:] for o in p.opts if o.startswith("--")] if p.param_type_name == "option" else [p.name]
        for name in names or [p.name]:
            keys[name] = keys[name.replace("-", "_")] = p.name
    return keys


def _load_config(ctx: typer.Context, param: Any, value: Path | None) -> Path | None:
    """Fill ``ctx.default_map`` from the file: a flag given on the command line still wins."""
    if value is None:
        return None
    import yaml

    try:
        raw = value.read_bytes()
        data = yaml.load(raw.decode("utf-8"), _unique_key_loader()) or {}
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {value}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise typer.BadParameter(f"{value}:{line}: not UTF-8 text (byte {exc.start}); a config file is a "
                                 "YAML mapping of option names to values") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{value}:{mark.line + 1}" if mark else str(value)
        raise typer.BadParameter(f"{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{value} must hold a flat mapping of option names to values")
    keys = config_keys(ctx.command)
    multiple = {p.name: getattr(p, "multiple", False) for p in ctx.command.params}
    mapped: dict[str, Any] = {}
    given: dict[str, str] = {}  # parameter -> the key that set it
    for key, val in data.items():
        key = str(key)
        name = keys.get(key)
        if name is None:
            raise typer.BadParameter(f"{value}: unknown option {key!r} for `spade {ctx.info_name}`")
        if name in given:
            raise typer.BadParameter(f"{value}: {given[name]!r} and {key!r} name the same setting; give it once")
        given[name] = key
        # `threads: 4` is a YAML int; the option is text because it also takes `auto`
        if name == "threads" and isinstance(val, int):
            val = str(val)
        # `envs: validated.jsonl` for a repeatable option, as one `--envs validated.jsonl` would give
        if multiple.get(name) and not isinstance(val, list):
            val = [val]
        mapped[name] = val
    ctx.default_map = {**(ctx.default_map or {}), **mapped}
    return value


def _unique_key_loader() -> type:
    """A YAML SafeLoader that refuses a mapping key given twice (PyYAML keeps the last one)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, list | dict):
                    continue  # an unhashable key: SafeLoader's own error names it
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {seen[key]} and {line}); give it once",
                        key_node.start_mark)
                seen[key] = line
            return super().construct_mapping(node, deep)

    return Loader


ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="Flat YAML mapping of option names to values; flags win.",
                 exists=True, dir_okay=False, is_eager=True, callback=_load_config),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo the work even if the output exists.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Run seed; every derived seed comes from it.")]
IterationOpt = Annotated[int, typer.Option("--iteration", help="Iteration number recorded in rows.")]
OutFileOpt = Annotated[Path, typer.Option("--out", help="Output JSONL (written atomically).", dir_okay=False)]
ModelOpt = Annotated[str, typer.Option("--model", help="Hugging Face checkpoint directory or id.")]
BackendOpt = Annotated[str, typer.Option("--backend", metavar="hf|vllm|openai", help="Generation backend: hf, vllm, openai (or a custom MODULE:CLASS).")]
BaseUrlOpt = Annotated[
    str | None, typer.Option("--base-url", help="OpenAI-compatible server for --backend openai.")
]
# Fixed choices as Literal types: help lists them and click refuses any other value (exit 2).
# tests/test_cli_help.py checks each against the constant of the module that acts on the value.
Signal = Literal["regret", "ema_lp", "learnability"]  # spade_cli.designer.curriculum.SIGNALS
Overflow = Literal["close", "end"]  # spade_cli.backends.thinking.OVERFLOW
Contract = Literal["full", "short", "spec"]  # spade_cli.designer.prompts.CONTRACTS
Tier = Literal["auto", "process", "strong"]  # "auto" or spade_cli.sandbox.config.TIERS
MinTier = Literal["process", "strong"]  # spade_cli.sandbox.config.TIERS
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


# The widest choice list shown as the metavar (``keep|drop|auto``); see ``_metavar``.
CHOICES_IN_METAVAR = 14


def _metavar(param: Any) -> str:
    """A short metavar from the parameter's type, so the type column stays narrow."""
    if getattr(param, "is_flag", False):
        return ""  # a switch takes no value: `<bool>` only steals width from the help text
    desc = param.type_descriptor
    if desc.is_choice:
        joined = "|".join(map(str, desc.choices or ()))
        if len(joined) <= CHOICES_IN_METAVAR:
            return joined
        # Longer lists would widen the type column until option names are cut: the help lists them.
        param.help = f"{param.help or ''} One of: {', '.join(map(str, desc.choices or ()))}.".strip()
        return "CHOICE"
    if desc.is_path:
        return {"file": "FILE", "directory": "DIR", "dir": "DIR"}.get(str(desc.path_type), "PATH")
    name = str(desc.annotation)
    return "INT" if "int" in name else "FLOAT" if "float" in name else "TEXT"


# One space between the columns of an options table instead of typer's two, and none for the empty
# short-option columns spade never fills: at 80 columns that is the width of a long option name.
typer.rich_utils.STYLE_OPTIONS_TABLE_PADDING = (0, 1, 0, 0)


class SpadeCommand(TyperCommand):
    """A typer command whose help reads well in an 80-column terminal.

    Typer's rich help is a table of option names, types and help; at 80 columns the default
    `<int range>` / `<bool>` type labels and hard-wrapped docstrings squeeze the help text into
    one-word columns and cut long option names with an ellipsis. So: short metavars (INT, FILE,
    none for a switch) unless a command set one, and docstring paragraphs joined into one line
    each so that rich wraps them to the terminal (a paragraph starting with \\b keeps its lines).

    Every command also takes ``--threads`` (spade_cli/core/threads.py), applied before the command's
    body runs, hence before it imports torch. Help shows it only where torch is loaded; elsewhere
    it stays accepted (scripts, ``SPADE_THREADS``, a shared ``--config``) and changes nothing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not any(p.name == "threads" for p in self.params):
            self.params.append(_threads_option())
            self.params[-1].hidden = self.name not in TORCH_COMMANDS
        for param in self.get_params(typer.Context(self)):  # get_params: --help included
            if param.metavar is None:
                param.metavar = _metavar(param) if isinstance(param, TyperOption) else param.name.upper()
        if self.help:
            paras = inspect.cleandoc(self.help).split("\n\n")
            self.help = "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paras)

    def invoke(self, ctx: typer.Context) -> Any:
        from spade_cli.core import threads

        n, source = threads.resolve(ctx.params.pop("threads", None), ctx.info_name or "", ctx.params)
        threads.apply(n, source)
        # Only where --model is loaded locally: with openai or --base-url it may be a name only the
        # server knows; fake and custom (module:Class) backends read it their own way.
        if (isinstance(ctx.params.get("model"), str) and ctx.params.get("backend", "hf") in ("hf", "vllm")
                and not ctx.params.get("base_url")):
            ctx.params["model"] = check_model(ctx.params["model"])
        return super().invoke(ctx)


class SpadeGroup(TyperGroup):
    """The ``spade`` group: its ``--help`` is a switch, shown without a type, as in every command."""

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt


def check_model(value: str) -> str:
    """The ``--model`` to load (``~`` expanded). One that can't be a checkpoint is a usage error here,
    not a loader's traceback later: a missing directory (a path no hub id looks like), a file, or,
    offline, a hub id that is not in the cache. Online, a hub id goes to the loader."""
    import os
    import re

    path = Path(value).expanduser()
    if path.is_dir():
        return str(path) if value.startswith("~") else value
    if path.exists():
        raise typer.BadParameter(f"{value} is a file; a checkpoint is a directory (save_pretrained)",
                                 param_hint="--model")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", value) or ".." in value:
        raise typer.BadParameter(f"{value}: no such checkpoint directory", param_hint="--model")
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
           for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(value, "config.json"), str):
            local = "/" in value and Path(value.split("/")[0]).is_dir()  # likely a typo'd run path
            raise typer.BadParameter(f"{value}: {'no such checkpoint directory, ' if local else ''}not a local "
                                     "directory, and not in the Hugging Face cache (offline: HF_HUB_OFFLINE is set)",
                                     param_hint="--model")
    return value


def _check_threads(ctx: typer.Context, param: Any, value: str | None) -> int | None:
    from spade_cli.core import threads

    try:
        return threads.parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _threads_option() -> TyperOption:
    """``--threads``, built by typer from an annotation like every other option (typer has no
    public call for one option outside a function signature)."""
    from typer.main import _get_param
    from typer.models import ParamMeta

    info = typer.Option("auto", "--threads", envvar="SPADE_THREADS", metavar="N|auto", callback=_check_threads,
                        help="torch/OpenMP threads; auto: free cores minus sandbox workers.")
    return _get_param(ParamMeta(name="threads", default=info, annotation=Annotated[str, info]))


def config_options(config: type) -> Callable[[Callable], Callable]:
    """Build a command's options from its config dataclass (``spade_cli.core.settings``).

    ``fn`` takes the filled ``config`` as the parameter annotated with it; the settings' options are
    listed where that parameter stands, among ``fn``'s own (``--config``, ``--force``...). Each
    declared field becomes ``--field-name`` (a bool on by default ``--x/--no-x``, a list a repeatable
    option, a ``Literal`` a choice) with the field's default, help and panel: a setting is declared
    once, and its flag, ``--config`` key and manifest key are its field's name.
    """
    import dataclasses
    import typing

    from spade_cli.core.settings import declared, default_of

    hints = typing.get_type_hints(config, include_extras=True)
    fields = declared(config)
    params, paths = [], set()
    for f in fields:
        meta, typ = f.metadata, hints[f.name]
        option = dict(meta["option"])
        default = default_of(f)
        if typing.get_origin(typ) is list:
            typ, default = typ | None, None  # typer's "none given" for a repeatable option
        elif {"file_okay", "dir_okay", "exists"} & set(option):
            typ, _ = Path, paths.add(f.name)
        flag = f"--{f.name.replace('_', '-')}"
        if typ is bool and default:
            flag += f"/--no-{flag[2:]}"  # a switch that is on by default: --x/--no-x (off by default: --x)
        info = typer.Option(flag, help=meta["help"], rich_help_panel=meta["panel"],
                            **option)
        required = meta["required"] or f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[typ, info],
                                        default=inspect.Parameter.empty if required else default))

    def wrap(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [p.replace(kind=p.KEYWORD_ONLY, annotation=hints[p.name]) for p in inspect.signature(fn).parameters.values()]
        at = next(i for i, p in enumerate(own) if p.annotation is config)  # the settings go where it stands

        @functools.wraps(fn)
        def call(**kw: Any) -> Any:
            values = {f.name: kw.pop(f.name) for f in fields}
            for f in fields:
                if values[f.name] is None and f.default_factory is not dataclasses.MISSING:
                    values[f.name] = f.default_factory()
                elif f.name in paths:
                    values[f.name] = str(values[f.name])
            return fn(**kw, **{own[at].name: config(**values)})

        call.__signature__ = inspect.Signature([*own[:at], *params, *own[at + 1:]])
        call.__annotations__ = {}  # typer reads the signature; fn's own hints name the config class
        return call

    return wrap


def resolved_config(ctx: typer.Context) -> dict[str, Any]:
    """The command's parameters after defaults, YAML and flags, JSON-safe, for the manifest."""
    out = {}
    for key, val in ctx.params.items():
        if key in NON_SEMANTIC:
            continue
        out[key] = str(val) if isinstance(val, Path) else val
    from spade_cli.core.artifacts import later_defaults_dropped

    return later_defaults_dropped(out, ctx.command.name or "")


def emit(summary: dict) -> None:
    """The one JSON line on stdout that recipes and `jq` read."""
    sys.stdout.write(json.dumps(summary, default=str, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def command(fn: Callable) -> Callable:
    """Turn a SpadeError or an OSError (disk full, permission denied, a file gone: ``os_error_of``)
    into a one-line message and exit 1 (2 for usage, 75 for SIGTERM), never a traceback. Any
    other exception is a bug and keeps its traceback."""
    from spade_cli.core import locks, preempt
    from spade_cli.core.errors import SpadeError, describe_os_error, os_error_of

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        preempt.install()  # SIGTERM: stop at a unit boundary, exit 75 (Preempted is a SpadeError)
        try:
            return fn(*args, **kwargs)
        except SpadeError as exc:
            console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None  # OutputError: usage, 2
        except Exception as exc:  # noqa: BLE001  (only an OSError, or a saver's stand-in for one, is handled)
            err = os_error_of(exc, kwargs.get("out"))
            if err is None or err.errno == errno.EPIPE:
                raise  # a bug keeps its traceback; stdout closed by `| head`: click exits quietly
            if "huggingface.co" in str(err):
                # a hub id that could not be fetched (no network, no such repo): the loader's message
                model = f"--model {kwargs['model']}: " if kwargs.get("model") else ""
                console.print(f"[bold red]error:[/] {model}{' '.join(str(err).split())} (local files only: "
                              "HF_HUB_OFFLINE=1)", soft_wrap=True)
            else:  # disk full, permission denied, a file gone: the path and the system's words
                console.print(f"[bold red]error:[/] {escape(describe_os_error(err))}", soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; rerun the same command to resume[/]")
            raise typer.Exit(130) from None
        finally:
            locks.release_all()  # a failed stage keeps its partial output, not its lock file

    return wrapper


def finish(summary: dict) -> None:
    """Print a short human line on stderr and the JSON summary on stdout."""
    if summary.get("status") == "up to date":
        console.print(f"[green]up to date[/]: {summary.get('out')} (pass --force to redo)")
    emit(summary)
