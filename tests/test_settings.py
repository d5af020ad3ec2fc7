"""One declaration per setting: a command's options are built from its config dataclass, and a
manifest written under a setting's older name is read under the current one.
"""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from spade_cli.app import app
from spade_cli.core.artifacts import KEYS_RENAMED, Stage, keys_renamed, manifest_path
from spade_cli.core.settings import declared, outside_choices
from spade_cli.rollout.episode_state import PlayConfig
from spade_cli.training.config import UpdateConfig

pytestmark = pytest.mark.unit
COMMANDS = get_command(app).commands


@pytest.mark.parametrize("command, config", [("update", UpdateConfig), ("rollout", PlayConfig)])
def test_every_declared_setting_is_an_option_with_its_help_default_and_choices(command, config) -> None:
    params = {p.name: p for p in COMMANDS[command].params}
    hints = typing.get_type_hints(config)
    for f in declared(config):
        p = params[f.name]
        assert p.opts[0] == f"--{f.name.replace('_', '-')}"
        assert p.help.startswith(f.metadata["help"]) and p.rich_help_panel == f.metadata["panel"]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert p.default == (None if default == [] else default) or p.required, f.name
        if typing.get_origin(hints[f.name]) is typing.Literal:
            assert tuple(p.type_descriptor.choices) == typing.get_args(hints[f.name]), f.name
        if hints[f.name] is bool:
            assert p.secondary_opts == ([f"--no-{f.name.replace('_', '-')}"] if default else []), f.name
    fixed = {f.name for f in dataclasses.fields(config)} - {f.name for f in declared(config)}
    assert not fixed & set(params), "a field declared without help is fixed in code, not an option"


def test_the_command_fills_the_config_it_declares(monkeypatch, tmp_path) -> None:
    """What the options parse is what the stage gets, field by field, as the dataclass."""
    seen = {}
    import stages.update

    monkeypatch.setattr(stages.update, "run", lambda cfg, **kw: seen.setdefault("cfg", cfg) and {"status": "ok",
                        "samples": 0, "loss": 0.0})
    res = CliRunner().invoke(app, ["update", "--model", str(tmp_path), "--out", str(tmp_path / "o"),
                                   "--envs", "a.jsonl", "--envs", "b.jsonl", "--no-tis", "--loss-type", "grpo",
                                   "--dr-grpo-length", "7", "--lora"])
    assert res.exit_code == 0, res.output
    cfg = seen["cfg"]
    assert isinstance(cfg, UpdateConfig)
    assert (cfg.envs, cfg.rollouts, cfg.tis, cfg.loss_type, cfg.dr_grpo_length, cfg.lora, cfg.out) == \
        (["a.jsonl", "b.jsonl"], [], False, "grpo", 7, True, str(tmp_path / "o"))


def test_a_value_outside_a_literal_is_refused_for_library_callers_too() -> None:
    assert outside_choices(UpdateConfig(model="m")) is None
    assert outside_choices(UpdateConfig(model="m", loss_type="ppo")) == \
        "loss_type must be one of grpo, bnpo, dr_grpo, dapo, got 'ppo'"
    res = CliRunner().invoke(app, ["update", "--model", "m", "--out", "o", "--loss-type", "ppo"])
    assert res.exit_code == 2 and "ppo" in res.output


def test_the_literals_are_what_the_trainer_accepts() -> None:
    from spade_cli.training import config as update_config
    from spade_cli.training import grpo

    assert typing.get_args(update_config.LossType) == grpo.LOSS_TYPES
    assert typing.get_args(update_config.Scale) == grpo.SCALES
    assert typing.get_args(update_config.TisMode) == grpo.TIS_MODES


def test_a_manifest_written_under_an_older_name_stays_up_to_date(tmp_path) -> None:
    """A run whose manifest recorded `importance_sampling` (now `tis`) is the same run; a value that
    differs under either name is still seen."""
    out = tmp_path / "scores.jsonl"
    out.write_text("{}\n")
    new = {"tis": True, "dr_grpo_length": None, "seed": 0}
    Stage.begin("update", out, new, {}).write_manifest(None, {})
    m = json.loads(manifest_path(out).read_text())
    m["config"] = {"importance_sampling": True, "max_completion_length": None, "seed": 0}  # as written before
    manifest_path(out).write_text(json.dumps(m))
    assert Stage.begin("update", out, new, {}).status() == "up to date"
    assert "tis True -> False" in Stage.begin("update", out, {**new, "tis": False}, {}).status()
    for stage, names in KEYS_RENAMED.items():
        assert keys_renamed(dict.fromkeys(names, 1), stage) == {n: 1 for n in names.values() if n}, stage


def test_design_without_memory_reads_an_old_manifest_that_recorded_the_switch_off(tmp_path) -> None:
    out = tmp_path / "designs.jsonl"
    out.write_text("{}\n")
    Stage.begin("design", out, {"memory": "m.jsonl"}, {}).write_manifest(None, {})
    m = json.loads(manifest_path(out).read_text())
    for no_memory, status in ((False, "up to date"), (True, "config changed: no_memory True -> None")):
        m["config"] = {"memory": "m.jsonl", "no_memory": no_memory}
        manifest_path(out).write_text(json.dumps(m))
        assert Stage.begin("design", out, {"memory": "m.jsonl"}, {}).status() == status
