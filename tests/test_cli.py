"""The command line as users meet it: help, docs, exit codes, config files, the tiny model."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spade_cli.app import app
from spade_cli.cli import ConfigOpt, resolved_config
from tests.conftest import REPO, run_spade

HEAVY = ("torch", "transformers", "trl", "vllm", "lm_eval", "datasets")


def _commands() -> list[str]:
    return sorted(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)


@pytest.mark.unit
@pytest.mark.parametrize("name", _commands())
def test_every_command_has_help_and_appears_in_the_readme(name):
    res = CliRunner().invoke(app, [name, "--help"])
    assert res.exit_code == 0, res.output
    cmd = next(c for c in app.registered_commands if (c.name or "") == name)
    assert (cmd.callback.__doc__ or "").strip(), f"`spade {name}` has no help text"
    assert "Example" in cmd.callback.__doc__, f"`spade {name}` help lacks an example"
    assert f"spade {name}" in (REPO / "README.md").read_text(), f"`spade {name}` is not in the README"


@pytest.mark.unit
@pytest.mark.parametrize("name", [None, *_commands()])
def test_help_reads_well_at_80_columns(name):
    # rich reads COLUMNS; a cut option name ends in '…', and a squeezed help column shows up as
    # lines whose help text is a single word
    args = [name, "--help"] if name else ["--help"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(map(len, lines)) <= 80, "help ignored the terminal width"
    cut = [line for line in lines if "…" in line]
    assert not cut, "cut at 80 columns:\n" + "\n".join(cut)
    # the help column starts where a panel's continuation lines (wrapped help) start, at the latest
    starts = [len(line) - len(line[1:].lstrip()) for line in lines
              if line.startswith("│") and line[1:].strip(" │") and not re.match(r"│ *[*]? *-", line)]
    if starts:
        assert 80 - max(starts) >= 20, f"help text squeezed into {80 - max(starts)} columns"


@pytest.mark.unit
def test_help_imports_no_heavy_library():
    code = ("import sys; from spade_cli.app import app; from typer.testing import CliRunner;"
            "CliRunner().invoke(app, ['--help']);"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.unit
def test_config_file_sets_options_and_flags_win(tmp_path):
    demo = typer.Typer()

    @demo.command()
    def run(ctx: typer.Context, config: ConfigOpt = None, n: int = 1, name: str = "a") -> None:
        print(json.dumps(resolved_config(ctx)))

    cfg = tmp_path / "c.yaml"
    cfg.write_text("n: 5\nname: from-file\n")
    res = CliRunner().invoke(demo, ["--config", str(cfg), "--name", "flag"])
    assert json.loads(res.output) == {"n": 5, "name": "flag"}
    cfg.write_text("bogus-key: 1\n")
    res = CliRunner().invoke(demo, ["--config", str(cfg)])
    assert res.exit_code == 2 and "unknown option 'bogus-key'" in " ".join(res.output.replace("│", " ").split())


@pytest.mark.integration
def test_inspect_names_the_bad_line_and_exits_1(tmp_path):
    p = tmp_path / "v.jsonl"
    p.write_text('{"schema": "spade.validation/1", "code": "x", "hint": "h", "valid": true}\n{"schema": "spade.val')
    res = run_spade("inspect", p)
    assert res.returncode == 1
    assert f"{p}:2: not valid JSON" in res.stderr.replace("\n", "")
    res = run_spade("inspect", tmp_path / "missing.jsonl")
    assert res.returncode == 1 and "no such file" in res.stderr
    res = run_spade("inspect")
    assert res.returncode == 2


@pytest.mark.integration
def test_inspect_summarises_and_shows_a_row(tmp_path):
    p = tmp_path / "v.jsonl"
    rows = [{"schema": "spade.validation/1", "code": "x = 1", "hint": "h", "valid": True},
            {"schema": "spade.validation/1", "code": "x = (", "hint": "h", "valid": False,
             "reason": "syntax_error"},
            {"schema": "spade.rollout/1", "episode_id": "e1", "env_id": "a", "iteration": 0, "hinted": True,
             "seed": 1, "pair": 0, "return": 1.0},
            {"schema": "spade.rollout/1", "episode_id": "e2", "env_id": "a", "iteration": 0, "hinted": False,
             "seed": 1, "pair": 0, "return": 0.25}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_spade("inspect", p, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["validation"]["valid"] == 1 and info["validation"]["reasons"] == {"syntax_error": 1}
    assert info["rollouts"]["hinted"]["mean"] == 1.0 and info["rollouts"]["unhinted"]["mean"] == 0.25
    res = run_spade("inspect", p, "--row", "1")
    assert res.returncode == 0 and "syntax_error" in res.stderr and "x = (" in res.stderr


@pytest.mark.integration
def test_init_model_builds_a_loadable_chat_model(tmp_path):
    out = tmp_path / "tiny"
    res = run_spade("init-model", "--out", out, "--size", "tiny")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["params"] < 1_000_000
    again = run_spade("init-model", "--out", out, "--size", "tiny")
    assert json.loads(again.stdout)["status"] == "up to date"
    assert not list(tmp_path.glob(".tiny.tmp-*"))

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.head_dim == 64
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]
    gen = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=True)
    assert gen.shape[1] > len(ids)
    # <think> and tool tokens are single tokens that survive skip_special_tokens.
    enc = tok("<think>a</think><tool_call>", add_special_tokens=False)["input_ids"]
    assert len(enc) == 4 and tok.decode(enc, skip_special_tokens=True) == "<think>a</think><tool_call>"


@pytest.mark.unit
def test_chat_template_never_rewrites_history(tiny_model):
    """The rollout relies on this: rendering a longer chat extends the shorter one's tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    short = [{"role": "system", "content": "s"}, {"role": "user", "content": "obs 1"},
             {"role": "assistant", "content": "<think>\nplan\n</think>\n\nmove"}]
    long = short + [{"role": "user", "content": "obs 2"}]
    a = tok.apply_chat_template(short, tokenize=False)
    b = tok.apply_chat_template(long, tokenize=False, add_generation_prompt=True)
    assert b.startswith(a) and "<think>\nplan\n</think>" in b


@pytest.mark.unit
def test_paths_come_from_the_layout(tmp_path):
    res = CliRunner().invoke(app, ["paths", str(tmp_path / "run"), "-i", "7"])
    table = json.loads(res.output)
    assert table["validated"] == str(tmp_path / "run" / "iter_0007" / "validated.jsonl")
    assert table["next_ckpt"] == str(tmp_path / "run" / "ckpt" / "iter_0008")
    # ema_lp's "before": the previous checkpoint's episodes, not a rollouts* file the report counts
    assert table["prev_ckpt"] == str(tmp_path / "run" / "ckpt" / "iter_0006")
    assert table["lp_before"] == str(tmp_path / "run" / "iter_0007" / "lp_before.jsonl")
    # the memory is versioned like the checkpoint: iteration 7 reads memory/iter_0007, writes iter_0008
    res = CliRunner().invoke(app, ["paths", str(tmp_path / "run"), "-i", "7", "--key", "memory"])
    assert res.output.strip() == str(tmp_path / "run" / "memory" / "iter_0007.jsonl")
    assert table["next_memory"] == str(tmp_path / "run" / "memory" / "iter_0008.jsonl")
    res = CliRunner().invoke(app, ["paths", str(tmp_path / "run with space"), "-i", "7", "--shell"])
    shell = dict(line.split("=", 1) for line in res.output.splitlines())
    assert shell["designs"] == "'" + str(tmp_path / "run with space" / "iter_0007" / "designs.jsonl") + "'"
    assert re.search("choose one of", CliRunner().invoke(app, ["paths", "r", "--key", "x"]).output)


@pytest.mark.unit
def test_paths_name_an_array_tasks_shard_and_the_glob_of_all_its_shards(tmp_path):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["paths", str(run), "-i", "3", "--shard", "2/16", "--key", "rollout_shard"])
    assert res.exit_code == 0 and res.output.strip() == str(run / "iter_0003" / "rollouts.shard-02-of-16.jsonl")
    table = json.loads(CliRunner().invoke(app, ["paths", str(run), "-i", "3", "--shard", "0/16"]).output)
    shards = [Path(table["rollouts_glob"]).parent / f"rollouts.shard-{s:02d}-of-16.jsonl" for s in range(16)]
    assert all(fnmatch.fnmatch(str(p), table["rollout_shards_glob"]) for p in shards)
    assert not fnmatch.fnmatch(str(run / "iter_0003" / "rollouts.shard-00-of-08.jsonl"), table["rollout_shards_glob"])
    assert fnmatch.fnmatch(str(shards[5]), table["rollouts_glob"])  # what regret and update read
    assert "rollout_shard" not in json.loads(CliRunner().invoke(app, ["paths", str(run)]).output)
    for bad in ("16/16", "x"):
        res = CliRunner().invoke(app, ["paths", str(run), "--shard", bad])
        assert res.exit_code == 2 and "--shard" in res.output, bad


@pytest.mark.unit
@pytest.mark.parametrize("name", _commands())
def test_every_command_takes_threads_and_leaves_it_out_of_the_config(name):
    from typer.main import get_command

    cmd = get_command(app).commands[name]
    opt = next((p for p in cmd.params if p.name == "threads"), None)
    assert opt is not None and opt.envvar == "SPADE_THREADS", f"`spade {name}` has no --threads"
    from spade_cli.cli import NON_SEMANTIC

    assert "threads" in NON_SEMANTIC


@pytest.mark.integration
def test_a_config_key_reruns_as_the_flag_did(tmp_path):
    """The manifest records parameters, not the words that set them: a run made with a flag is up
    to date when rerun with the same setting from a config file; a retired key is refused."""
    from spade_cli.core.records import Rollout, Validation, to_row

    env = to_row(Validation(code="x = 1", hint="h", valid=True))
    (tmp_path / "v.jsonl").write_text(json.dumps(env) + "\n")
    eps = [to_row(Rollout(episode_id=f"e{h}", env_id=env["env_id"], iteration=0, hinted=bool(h), seed=1, pair=0,
                          return_=float(h))) for h in (0, 1)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    base = ["regret", "--envs", "v.jsonl", "--rollouts", "r.jsonl", "--out", "s.jsonl"]
    res = run_spade(*base, "--no-seed-audit", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for text in ("seed-audit: false\n", "seed_audit: false\n"):
        (tmp_path / "c.yaml").write_text(text)
        res = run_spade(*base, "--config", "c.yaml", cwd=tmp_path)
        assert res.returncode == 0 and json.loads(res.stdout)["status"] == "up to date", (text, res.stderr)
    (tmp_path / "c.yaml").write_text("audit: false\n")  # the retired key: unknown
    res = run_spade(*base, "--config", "c.yaml", cwd=tmp_path)
    assert res.returncode == 2 and "unknown option 'audit'" in res.stderr, res.stderr
    (tmp_path / "c.yaml").write_text("seed-audit: true\n")  # another setting: the comparison sees it
    res = run_spade(*base, "--config", "c.yaml", cwd=tmp_path)
    assert res.returncode == 1 and "pass --force" in res.stderr, res.stderr
