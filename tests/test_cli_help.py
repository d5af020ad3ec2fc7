"""What `--help` and the docs promise about the command line, checked against the commands themselves.

The loop's commands come first in `spade --help`, in pipeline order; an option name or type is never
cut at 80 columns; fixed choices are listed and match what the code acts on; `--threads` shows
where torch loads; a stage's options and its config dataclass name the same settings with the
same defaults; and every `docs/...` link and every `spade CMD --option` the docs name exists.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from spade_cli import cli
from spade_cli.app import app
from tests.conftest import REPO

pytestmark = pytest.mark.unit

LOOP = ["design", "validate", "rollout", "regret", "update", "eval"]
GROUP = get_command(app)
COMMANDS = dict(GROUP.commands)


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert res.exit_code == 0, res.output
    return res.output


def test_the_loop_comes_first_in_pipeline_order() -> None:
    listed = [m[1] for m in re.finditer(r"^│ ([a-z][a-z-]*) ", _help(), re.M)]
    assert listed[:len(LOOP)] == LOOP, listed
    assert set(listed) == set(COMMANDS), "a command is missing from `spade --help`"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_option_names_and_types_are_whole_at_80_columns(name: str) -> None:
    text = _help(name)
    tokens = set(re.findall(r"[^\s│]+", text))
    for param in get_command(app).commands[name].params:
        if getattr(param, "hidden", False) or not param.opts[0].startswith("-"):
            continue
        for opt in (*param.opts, *param.secondary_opts):
            assert opt in tokens, f"`spade {name} --help` cuts or hides {opt}"
        if param.metavar:
            assert param.metavar in tokens, f"`spade {name} --help` breaks the type of {param.opts[0]}"


# Each Literal in spade_cli.cli against the constant of the module that acts on the value.
def _constants() -> list[tuple[object, tuple]]:
    from spade_cli.backends.thinking import CONTEXTS, OVERFLOW
    from spade_cli.designer.curriculum import SIGNALS
    from spade_cli.designer.prompts import CONTRACTS
    from spade_cli.sandbox.config import TIERS

    return [(cli.Signal, SIGNALS), (cli.Overflow, OVERFLOW), (cli.Contract, tuple(CONTRACTS)),
            (cli.Tier, ("auto", *TIERS)), (cli.MinTier, TIERS), (("rollout", "think_context"), CONTEXTS)]


def test_choices_are_what_the_code_accepts() -> None:
    from spade_cli.models import gguf, tinymodel
    from stages import rollout

    for typ, accepted in _constants():
        if isinstance(typ, tuple):
            assert _choices(typ[0], typ[1]) == tuple(accepted)
        else:
            assert typing.get_args(typ) == tuple(accepted), typ
    assert _choices("rollout", "batching") == rollout.BATCHING
    assert _choices("init-model", "size") == tuple(tinymodel.SIZES)
    assert _choices("init-model", "dtype") == gguf.DTYPES


def _choices(command: str, name: str) -> tuple:
    return tuple(next(p for p in COMMANDS[command].params if p.name == name).type_descriptor.choices)


def test_a_value_outside_the_choices_is_a_usage_error() -> None:
    res = CliRunner().invoke(app, ["regret", "--envs", "v.jsonl", "--rollouts", "r.jsonl", "--out", "s.jsonl",
                                   "--signal", "regrett"])
    assert res.exit_code == 2 and "regrett" in res.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_threads_shows_only_where_torch_loads(name: str) -> None:
    shown = "--threads" in _help(name)
    assert shown == (name in cli.TORCH_COMMANDS), name
    # accepted everywhere all the same: recipes and a shared --config may pass it
    assert any(p.name == "threads" for p in COMMANDS[name].params)


def test_design_and_warmstart_help_name_what_the_loop_uses() -> None:
    design = " ".join(_help("design").split())
    for path in re.findall(r"spade design [^│╭]*?--memory (\S+)", design):
        assert re.fullmatch(r"\S*memory/iter_\d{4}\.jsonl", path), f"design's help shows a memory path the loop does not use: {path}"
    for name in ("design", "warmstart"):
        pool = next(p for p in COMMANDS[name].params if p.name == "pool")
        assert "'family'" in pool.help, f"`spade {name} --pool` help does not list the family pool"


# -- config dataclasses and the options that fill them -------------------------------------------

def _defaults(command: str) -> dict[str, object]:
    return {p.name: p.default for p in COMMANDS[command].params}


def _same_default(option: object, field: dataclasses.Field) -> bool:
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    if default == [] and option is None:  # a repeatable option's "none given"
        return True
    return option == default


def test_update_options_are_update_config_fields() -> None:
    from stages.update import UpdateConfig

    options = _defaults("update")
    fields = {f.name: f for f in dataclasses.fields(UpdateConfig)}
    cli_only = {"config", "force", "threads"}
    config_only = {"use_bias_correction_kl"}  # TRL's default, kept fixed: the k3 estimator's bias fix
    assert set(options) - cli_only == set(fields) - config_only
    differ = [n for n in set(options) & set(fields) - {"model", "out"} if not _same_default(options[n], fields[n])]
    assert not differ, f"update's option defaults differ from UpdateConfig's: {sorted(differ)}"


def test_rollout_options_are_play_config_fields() -> None:
    from spade_cli.rollout.episode_state import PlayConfig

    options = _defaults("rollout")
    fields = {f.name: f for f in dataclasses.fields(PlayConfig)}
    assert set(fields) <= set(options), f"PlayConfig fields without a rollout option: {set(fields) - set(options)}"
    differ = [n for n in fields if not _same_default(options[n], fields[n])]
    assert not differ, f"rollout's option defaults differ from PlayConfig's: {sorted(differ)}"


# -- the docs ----------------------------------------------------------------------------------

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [*DOCS, REPO / "README.md"]
# A stage page's option tables name that page's commands' options.
PAGE_COMMANDS = {"design.md": {"design", "warmstart"}, "sandbox.md": {"validate", "doctor"},
                 "rollout.md": {"rollout"}, "regret.md": {"regret"}, "update.md": {"update"},
                 "eval.md": {"eval"}, "report.md": {"report", "compare"}}


def _options(command: str) -> set[str]:
    return {o for p in COMMANDS[command].params for o in (*p.opts, *p.secondary_opts)}


def _spade_calls(text: str) -> list[tuple[str, str]]:
    """(command, the rest of the call) for every `spade CMD ...` in code: inline or in blocks."""
    text = re.sub(r"\\\n\s*", " ", text)  # a shell line continued
    calls = []
    for code in re.findall(r"```.*?```|`[^`\n]+`", text, re.S):
        for line in code.strip("`").splitlines():
            for m in re.finditer(r"\bspade ([a-z][a-z-]+)(.*)", line):
                if m[1] in COMMANDS:  # the call ends at a pipe, a ';', '&&', a comment or a ')'
                    calls.append((m[1], re.split(r" \| |;|&&| #|\)", m[2])[0]))
    return calls


# Options of other tools that the docs name in backticks (pip, pytest, sbatch, bubblewrap, the servers).
EXTERNAL = {"--help", "--no-deps", "--durations", "--requeue", "--dependency", "--export", "--kill-on-invalid-dep",
            "--new-session", "--logprobs-mode", "--served-model-name", "--enable-sleep-mode", "--max-logprobs"}


def _recipe_options() -> set[str]:
    return {o for p in (REPO / "recipes").rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".sbatch", "")
            for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", p.read_text(errors="replace"))}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_docs_link_exists(page: Path) -> None:
    text = page.read_text()
    base = page.parent
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"[a-z]+:", target) and not (base / target).exists():
            missing.append(target)
    for target in re.findall(r"(?<![\w/.])(docs/[\w./-]+\.md)", text):
        if not (REPO / target).exists():
            missing.append(target)
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_option_the_docs_name_exists(page: Path) -> None:
    text = page.read_text()
    wrong = [f"spade {cmd} {opt}" for cmd, rest in _spade_calls(text)
             for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest) if opt not in _options(cmd)]
    for cmd_set in [PAGE_COMMANDS.get(page.name, set())]:
        if not cmd_set:
            continue
        known = set().union(*map(_options, cmd_set))
        for opt in re.findall(r"^\| `(--[a-z][a-z0-9-]*)", text, re.M):
            if opt not in known:
                wrong.append(f"{'/'.join(sorted(cmd_set))} {opt}")
    known = set().union(*map(_options, COMMANDS)) | _recipe_options() | EXTERNAL
    wrong += sorted({o for o in re.findall(r"`(--[a-z][a-z0-9-]*)", text) if o not in known})
    assert not wrong, f"{page.name} names options that do not exist: {wrong}"


def test_the_docs_checker_finds_a_wrong_option() -> None:
    calls = _spade_calls("run `spade design --pool family --n 2` or\n```\nspade update --model m \\\n  --no-such x\n```")
    assert [(c, rest.split()) for c, rest in calls] == [("design", ["--pool", "family", "--n", "2"]),
                                                       ("update", ["--model", "m", "--no-such", "x"])]


# -- one name per concept: a setting's parameter, flag and --config key are one name -------------

# Option names retired for one name per concept; they are refused like any unknown option.
RETIRED = {"update": ["--designs", "--max-completion-length", "--audit", "--importance-sampling"],
           "regret": ["--audit"], "warmstart": ["--agent-episodes"], "eval": ["--max-steps"],
           "rollout": ["--max-new-tokens", "--env-threads"], "validate": ["--max-steps"]}
REQUIRED = {"regret": ["--envs", "v.jsonl", "--rollouts", "r.jsonl", "--out", "s.jsonl"],
            "warmstart": ["--model", "m", "--out", "o"], "eval": ["--model", "m", "--out", "e.jsonl"],
            "update": ["--model", "m", "--out", "ckpt"], "serve": ["--run-dir", "runs/r"],
            "rollout": ["--model", "m", "--envs", "v.jsonl", "--out", "r.jsonl"],
            "design": ["--pool", "bundled", "--out", "d.jsonl"],
            "validate": ["--designs", "d.jsonl", "--out", "v.jsonl"]}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_named_as_its_parameter(name: str) -> None:
    """name = flag = --config key = manifest key: no alias between what a user types and what is recorded."""
    for p in COMMANDS[name].params:
        if p.param_type_name == "option" and p.name not in ("help", "as_json"):  # --json: the module's name
            assert p.opts[0] == f"--{p.name.replace('_', '-')}", (name, p.name, p.opts)


@pytest.mark.parametrize("command, old", [(c, o) for c, names in RETIRED.items() for o in names])
def test_a_retired_option_name_is_a_usage_error(command: str, old: str) -> None:
    res = CliRunner().invoke(app, [command, *REQUIRED[command], old, "3"])
    assert res.exit_code == 2 and "No such option" in _flat(res.output), res.output


def _with_option(opt: str) -> list[str]:
    return sorted(c for c in COMMANDS if opt in _options(c))


def test_one_name_per_concept() -> None:
    assert "--envs" in _options("update") and "--designs" not in _options("update")  # as rollout, regret
    assert {"design", "eval", "rollout"} <= set(_with_option("--max-tokens"))  # the cap of one reply
    assert _with_option("--max-new-tokens") == _with_option("--max-completion-length") == []
    assert _with_option("--max-steps") == ["update"]  # optimizer steps, TRL's name
    assert _with_option("--audit") == []  # regret's --seed-audit, update's --weight-audit
    assert _with_option("--workers") == ["rollout", "validate"]  # sandbox workers at once; --threads: torch's
    assert _with_option("--env-threads") == []
    assert not [o for c in COMMANDS for o in _options(c) if o.startswith("--use-")]  # switches read --x/--no-x


# -- --config keys: the options' names -------------------------------------------------------------

@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_a_config_file_speaks_the_option_names(command: str, tmp_path: Path) -> None:
    cmd = COMMANDS[command]
    keys = cli.config_keys(cmd)
    for p in cmd.params:
        if p.param_type_name != "option" or p.name in ("config", "help") or p.opts[0][2:] in {*REQUIRED[command]}:
            continue
        assert keys[p.opts[0][2:]] == keys[p.name] == p.name
    for old in RETIRED.get(command, []):
        cfg = tmp_path / f"{command}.yaml"
        cfg.write_text(json.dumps({old[2:]: 3}))
        with pytest.raises(typer.BadParameter, match=f"unknown option '{old[2:]}'"):
            cmd.make_context(command, [*REQUIRED[command], "--config", str(cfg)])


def test_one_setting_twice_in_a_config_file_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-tokens: 8\nmax_tokens: 9\n")
    res = CliRunner().invoke(app, ["rollout", "--model", "m", "--envs", "v", "--out", "r", "--config", str(cfg)])
    assert res.exit_code == 2 and "'max-tokens' and 'max_tokens' name the same setting" in _flat(res.output)
    cfg.write_text("max-new-tokens: 8\n")  # not rollout's max_new_tokens parameter by another name: its old flag
    res = CliRunner().invoke(app, ["design", "--pool", "bundled", "--out", "d", "--config", str(cfg)])
    assert res.exit_code == 2 and "unknown option 'max-new-tokens' for `spade design`" in _flat(res.output)


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())
