"""Bad input as a careless user or a broken upstream tool hands it to each stage, through the real CLI.

Every case asserts what docs/architecture.md, 'Command conventions', promises: the exit status (2 for an output path that cannot or
must not be written, 1 for a bad input row), a one-line message naming the file (and line and
field for a bad row), no traceback, and nothing under the final output name — an output that is
also an input is left byte for byte as it was. No case needs a model: every refusal happens before
one would be loaded (``--model`` points at a plain folder).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from spade_cli.core.records import Rollout, Validation, to_row
from tests.conftest import run_spade

pytestmark = pytest.mark.integration

CODE = "import gymnasium as gym\n\n\nclass E(gym.Env):\n    pass\n"
STAGES = ("design", "validate", "rollout", "regret", "update")
# The input each stage must never overwrite (the flag's file in _argv).
MAIN_INPUT = {"design": "pool.jsonl", "validate": "designs.jsonl", "rollout": "validated.jsonl",
              "regret": "rollouts.jsonl", "update": "model"}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _episode(env_id: str, hinted: bool, ret: float, **kw: object) -> dict:
    return to_row(Rollout(episode_id=f"{env_id}-{int(hinted)}", env_id=env_id, iteration=0, hinted=hinted,
                          seed=1, pair=0, return_=ret, **kw))


@pytest.fixture
def d(tmp_path: Path) -> Path:
    """Good inputs for every stage: a pool, designs, a valid env, its two episodes, a model folder."""
    design = {"schema": "spade.design/1", "code": CODE, "hint": "h"}
    _jsonl(tmp_path / "pool.jsonl", [design])
    _jsonl(tmp_path / "designs.jsonl", [design])
    env = to_row(Validation(code=CODE, hint="h", valid=True))
    _jsonl(tmp_path / "validated.jsonl", [env])
    _jsonl(tmp_path / "rollouts.jsonl", [_episode(env["env_id"], True, 1.0), _episode(env["env_id"], False, 0.0)])
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "afile").write_text("a regular file\n")
    return tmp_path


def _argv(stage: str, d: Path, out: str | Path, **inputs: str | Path) -> list:
    f = {"pool": d / "pool.jsonl", "designs": d / "designs.jsonl", "validated": d / "validated.jsonl",
         "rollouts": d / "rollouts.jsonl", **inputs}
    return {"design": ["design", "--pool", f["pool"], "--n", "1", "--out", out],
            "validate": ["validate", "--designs", f["designs"], "--out", out],
            "rollout": ["rollout", "--model", d / "model", "--envs", f["validated"], "--k", "1", "--out", out],
            "regret": ["regret", "--envs", f["validated"], "--rollouts", f["rollouts"], "--out", out],
            "update": ["update", "--model", d / "model", "--rollouts", f["rollouts"], "--out", out]}[stage]


def _refused(res, code: int, message: str, out: Path | None) -> None:
    text = res.stderr + res.stdout
    assert res.returncode == code, text
    assert "Traceback" not in text and "File \"" not in text, text
    assert re.search(message, _flat(res.stderr)), res.stderr
    if out is not None and not out.is_dir():
        assert not list(out.parent.glob(out.name + "*")), "something was written under the output name"


def _flat(text: str) -> str:
    """stderr as one line: rich wraps long messages and click draws a box around its usage errors."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def _snapshot(path: Path) -> dict:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(p): p.read_bytes() for p in files if p.is_file()}


# -- output paths: exit 2 before any work --------------------------------------------------------
@pytest.mark.parametrize("stage", STAGES)
def test_out_equal_to_an_input_is_refused_and_the_input_kept(d: Path, stage: str) -> None:
    victim = d / MAIN_INPUT[stage]
    before = _snapshot(victim)
    res = run_spade(*_argv(stage, d, victim))
    _refused(res, 2, rf"--out {re.escape(str(victim))} is also an input", None)
    assert _snapshot(victim) == before


@pytest.mark.parametrize("stage", ["validate", "update"])
def test_a_symlink_does_not_hide_the_input(d: Path, stage: str) -> None:
    link = d / "link"
    link.symlink_to(d / MAIN_INPUT[stage])
    before = _snapshot(d / MAIN_INPUT[stage])
    _refused(run_spade(*_argv(stage, d, link)), 2, "is also an input", None)
    assert _snapshot(d / MAIN_INPUT[stage]) == before


def test_dot_slash_does_not_hide_the_input(d: Path) -> None:
    before = _snapshot(d / "designs.jsonl")
    res = run_spade("validate", "--designs", "designs.jsonl", "--out", "./sub/../designs.jsonl", cwd=d)
    _refused(res, 2, r"designs.jsonl is also an input", None)
    assert _snapshot(d / "designs.jsonl") == before


@pytest.mark.parametrize("stage", STAGES)
def test_out_under_a_regular_file(d: Path, stage: str) -> None:
    out = d / "afile" / "out"
    _refused(run_spade(*_argv(stage, d, out)), 2, rf"cannot write --out {re.escape(str(out))}: .*afile is not a "
             "directory", out)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs procfs")
@pytest.mark.parametrize("stage", STAGES)
def test_out_on_a_pseudo_filesystem(d: Path, stage: str) -> None:
    out = Path("/proc/spade-bad-input/out")
    _refused(run_spade(*_argv(stage, d, out)), 2, r"cannot write --out /proc/spade-bad-input/out", None)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
@pytest.mark.parametrize("stage", ["validate", "regret"])
def test_out_in_a_read_only_directory(d: Path, stage: str) -> None:
    ro = d / "ro"
    ro.mkdir(mode=0o555)
    _refused(run_spade(*_argv(stage, d, ro / "out.jsonl")), 2, r"cannot write --out .*ro/out.jsonl", ro / "out.jsonl")


@pytest.mark.parametrize("stage", ["design", "rollout"])
def test_out_is_a_special_file_or_a_directory(d: Path, stage: str) -> None:
    # a FIFO stands for /dev/null & co: a regression must not replace a real device on the machine
    os.mkfifo(d / "fifo")
    _refused(run_spade(*_argv(stage, d, d / "fifo")), 2, "fifo exists and is not a regular file", None)
    assert (d / "fifo").is_fifo()
    _refused(run_spade(*_argv(stage, d, d / "model")), 2, "is a directory", None)


def test_update_out_must_be_a_directory_and_not_hold_an_input(d: Path) -> None:
    _refused(run_spade(*_argv("update", d, d / "afile")), 2, "afile'? is a file", None)
    _refused(run_spade(*_argv("update", d, d)), 2, rf"--out {re.escape(str(d))} contains the input", None)


def test_regret_side_outputs_are_checked_too(d: Path) -> None:
    base = _argv("regret", d, d / "scores.jsonl")
    _refused(run_spade(*base, "--memory-out", d / "validated.jsonl"), 2,
             "--memory-out .*validated.jsonl is also an input", d / "scores.jsonl")
    _refused(run_spade(*base, "--memory-out", d / "scores.jsonl"), 2,
             "--memory-out .*scores.jsonl is also an input", None)
    _refused(run_spade(*base, "--replay", "1", "--replay-out", d / "rollouts.jsonl"), 2,
             "--replay-out .*rollouts.jsonl is also an input", d / "scores.jsonl")


# -- bad rows: exit 1, file:line: field ------------------------------------------------------------
def _bad_rows(d: Path) -> list[tuple[str, dict, str]]:
    """(stage, {input role: rows}, the message after 'FILE:LINE: ') for each broken row."""
    good = json.loads((d / "validated.jsonl").read_text())
    env_id = good["env_id"]
    design = {"schema": "spade.design/1", "code": CODE, "hint": "h"}
    ep = _episode(env_id, True, 1.0)
    return [
        ("design", {"pool": [design, {**design, "code": 123}]}, "field 'code' must be a string or null, got 123"),
        ("validate", {"designs": [design, {**design, "code": 123}]}, "field 'code' must be a string or null"),
        ("validate", {"designs": [design, {**design, "hint": ["a", "b"]}]}, "field 'hint' must be a string or null"),
        ("rollout", {"validated": [good, {**good, "env_id": 12345}]}, "field 'env_id' must be a string, got 12345"),
        ("rollout", {"validated": [good, {k: v for k, v in good.items() if k != "valid"}]},
         r"spade.validation/1 row lacks required field\(s\): valid"),
        ("regret", {"validated": [good, {**good, "valid": "yes"}]}, "field 'valid' must be true or false"),
        ("regret", {"rollouts": [{**ep, "hinted": False, "episode_id": "u"}, {**ep, "return": 7.5}]},
         r"field 'return' must lie in \[0, 1\] \(the env contract\), got 7.5"),
        ("regret", {"rollouts": [ep, {**ep, "return": 0.5}]},
         rf"episode '{ep['episode_id']}' is also at .*rollouts-bad.jsonl:1 with other values"),
        ("update", {"rollouts": [ep, {**ep, "episode_id": "x", "hinted": "no"}]},
         "field 'hinted' must be true or false, got 'no'"),
        ("update", {"rollouts": [ep, {**ep, "error": "crashed", "return": -0.5}]},
         rf"episode '{ep['episode_id']}' is also at .*rollouts-bad.jsonl:1 with other values"),
        # a tokens object without completion_ids is no "episode without tokens" to leave out
        ("update", {"rollouts": [ep, {**ep, "episode_id": "x", "tokens": {"prompt_ids": "x"}}]},
         "field 'tokens.completion_ids' is missing"),
        ("update", {"rollouts": [ep, {**ep, "episode_id": "x", "tokens": {"prompt_ids": "x", "completion_ids": [1]}}]},
         "field 'tokens.prompt_ids' must be a list of integers, got 'x'"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_a_bad_row_names_file_line_and_field(d: Path, case: int) -> None:
    stage, broken, message = _bad_rows(d)[case]
    (role, rows), = broken.items()
    path = _jsonl(d / f"{role}-bad.jsonl", rows)
    out = d / ("ckpt" if stage == "update" else "out.jsonl")
    _refused(run_spade(*_argv(stage, d, out, **{role: path})), 1, rf"{re.escape(str(path))}:2: {message}", out)


def test_an_empty_pool_file_is_named(d: Path) -> None:
    empty = _jsonl(d / "empty.jsonl", [])
    out = d / "out.jsonl"
    _refused(run_spade(*_argv("design", d, out, pool=empty)), 1,
             rf"{re.escape(str(empty))}: the pool file holds no environment", out)


@pytest.mark.parametrize("flags", [["--pool", "{empty}"], ["--agent-pool", "{empty}", "--solver-seeds", "1"]])
def test_warmstart_names_an_empty_pool_file_before_loading_a_model(d: Path, flags: list[str]) -> None:
    # `model` is no checkpoint: a pool read after the tokenizer loads would fail there, with a traceback
    empty = _jsonl(d / "empty.jsonl", [])
    out = d / "warm"
    res = run_spade("warmstart", "--model", d / "model", "--out", out, *[f.format(empty=empty) for f in flags])
    _refused(res, 1, rf"{re.escape(str(empty))}: the pool file holds no environment", out)


@pytest.mark.parametrize("rows", [[], [{"schema": "spade.validation/1", "code": CODE, "hint": "h", "valid": False}]])
def test_eval_names_a_suite_with_nothing_to_play_before_loading_a_model(d: Path, rows: list) -> None:
    # it would score n=0 with exit 0; `model` is no checkpoint, so a check after loading could not pass
    suite = _jsonl(d / "suite.jsonl", rows)
    out = d / "eval.jsonl"
    res = run_spade("eval", "--model", d / "model", "--tasks", f"envs:{suite}", "--out", out)
    _refused(res, 1, rf"{re.escape(str(suite))}: the env suite holds no valid environment", out)


@pytest.mark.parametrize("stage, role", [("validate", "designs"), ("regret", "rollouts"), ("update", "rollouts")])
def test_a_directory_given_as_an_input_file(d: Path, stage: str, role: str) -> None:
    out = d / ("ckpt" if stage == "update" else "out.jsonl")
    res = run_spade(*_argv(stage, d, out, **{role: d / "model"}))
    _refused(res, 1, rf"{re.escape(str(d / 'model'))}: cannot read it: Is a directory", out)


def test_an_identical_repeated_episode_is_counted_once_with_a_warning(d: Path) -> None:
    rows = (d / "rollouts.jsonl").read_text().splitlines()
    path = _jsonl(d / "twice.jsonl", [json.loads(r) for r in (*rows, rows[0])])
    res = run_spade(*_argv("regret", d, d / "scores.jsonl", rollouts=path))
    assert res.returncode == 0, res.stderr
    assert re.search(rf"1 duplicated episode row\(s\).*counted once \({re.escape(str(path))}:3 repeats .*:1\)",
                     _flat(res.stderr)), res.stderr
    (score,) = [json.loads(r) for r in (d / "scores.jsonl").read_text().splitlines()]
    assert (score["hinted_n"], score["unhinted_n"], score["regret"]) == (1, 1, 1.0)


# -- --model that cannot be a checkpoint: exit 2 before any loader runs ----------------------------
@pytest.mark.parametrize("stage", ["rollout", "update"])
@pytest.mark.parametrize("model, message", [
    ("run/ckpt/iter_0001", "run/ckpt/iter_0001: no such checkpoint directory"),  # no hub id has two slashes
    ("{d}/nope", "nope: no such checkpoint directory"),
    ("{d}/afile", "afile is a file; a checkpoint is a directory"),
    ("model/iter_9", "model/iter_9: no such checkpoint directory"),  # offline, and model/ is a local dir
    ("no-such-org/no-such-model", "not a local directory, and not in the Hugging Face cache"),  # offline here
])
def test_a_model_that_is_no_checkpoint_is_a_usage_error(d: Path, stage: str, model: str, message: str) -> None:
    argv = [str(a) for a in _argv(stage, d, d / "out")]
    argv[argv.index("--model") + 1] = model.format(d=d)
    res = run_spade(*argv, cwd=d)
    _refused(res, 2, re.escape(message), d / "out")


def test_a_model_check_keeps_what_can_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spade_cli.cli import check_model

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    assert check_model("~/ckpt") == str(tmp_path / "ckpt")  # expanded, as the loader needs it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen").mkdir()  # a local folder named like the hub org
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert check_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"  # online: the hub's to answer


# -- --config files: exit 2 naming the file and line ---------------------------------------------------
@pytest.mark.parametrize("content, message", [
    (b"designs: designs.jsonl\nout: a.jsonl\nout: b.jsonl\n",
     r"{cfg}:3: the key 'out' is given twice \(lines 2 and 3\); give it once"),
    (b"designs: designs.jsonl\nout: a.jsonl\n" + bytes(range(128, 256)),
     r"{cfg}:3: not UTF-8 text \(byte 36\); a config file is a YAML mapping"),
    (b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe", r"{cfg}:1: not UTF-8 text \(byte 9\)"),
    (b"out: [a.jsonl\n", r"{cfg}:2: expected ',' or '\]'"),
])
def test_a_bad_config_file_is_a_usage_error_naming_file_and_line(d: Path, content: bytes, message: str) -> None:
    cfg = d / "c.yaml"
    cfg.write_bytes(content)
    res = run_spade("validate", "--designs", d / "designs.jsonl", "--out", d / "out.jsonl", "--config", cfg, cwd=d)
    _refused(res, 2, message.format(cfg=re.escape(str(cfg))), d / "out.jsonl")
    assert not (d / "a.jsonl").exists() and not (d / "b.jsonl").exists()


# -- a lone surrogate: a bad row naming file and line, on every reader path ---------------------------------
def _with_surrogate(row: dict, field: str) -> str:
    """The row as JSON whose ``field`` ends in the escape \\ud800 with no low half after it."""
    return json.dumps({**row, field: "x"}).replace(f'"{field}": "x"', f'"{field}": "x\\ud800"')


@pytest.mark.parametrize("stage, role, field", [
    ("validate", "designs", "hint"),
    ("rollout", "validated", "code"),
    ("regret", "rollouts", "episode_id"),  # msgspec's fast path refuses it; the fallback must too
    ("regret", "validated", "hint"),
    ("update", "rollouts", "episode_id"),
])
def test_a_lone_surrogate_is_a_bad_row(d: Path, stage: str, role: str, field: str) -> None:
    good = {"designs": d / "designs.jsonl", "validated": d / "validated.jsonl", "rollouts": d / "rollouts.jsonl"}[role]
    first, *rest = good.read_text().splitlines()
    path = d / f"{role}-bad.jsonl"
    path.write_text("\n".join([first, _with_surrogate(json.loads((rest or [first])[0]), field)]) + "\n")
    out = d / ("ckpt" if stage == "update" else "out.jsonl")
    _refused(run_spade(*_argv(stage, d, out, **{role: path})), 1,
             rf"{re.escape(str(path))}:2: field '{field}' holds a lone surrogate", out)


def test_raw_surrogate_bytes_are_refused_and_a_pair_is_text(tmp_path: Path) -> None:
    from spade_cli.core.artifacts import InputError, dumps, json_line

    with pytest.raises(InputError, match=r"f:4: field 'a\[1\].b' holds a lone surrogate"):
        json_line("f", 4, b'{"a": [1, {"b": "\xed\xa0\x80"}]}')  # its UTF-8 bytes, not an escape
    with pytest.raises(InputError, match="f:1: a key holds a lone surrogate"):
        json_line("f", 1, b'{"\\udc00": 1}')
    assert json_line("f", 1, b'{"a": "\\ud83d\\ude00 \\u00e9"}') == {"a": "\U0001F600 \u00e9"}  # a pair is one char
    # a writer never produces one: a surrogate in memory is written as U+FFFD, valid UTF-8
    line = dumps({"a": "x\ud800y", "b": "\u00e9"})
    assert line == '{"a":"x\ufffdy","b":"\u00e9"}' and json_line("f", 1, line.encode()) == json.loads(line)


# -- counts that size memory: refused before anything is laid out ----------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["rollout", "--model", "{d}/model", "--envs", "{d}/validated.jsonl", "--budget-pairs", "1000000000000"],
     r"--budget-pairs 1000000000000 over 1 env\(s\) would lay out 2,000,000,000,000 episodes in this process, "
     r"more than 1,000,000: .*--shard I/N"),
    (["rollout", "--model", "{d}/model", "--envs", "{d}/validated.jsonl", "--k", "100000000000"],
     r"--k 100000000000 would lay out 200,000,000,000 episodes"),
    (["eval", "--model", "{d}/model", "--tasks", "envs:{d}/validated.jsonl", "--k", "100000000000"],
     r"--k 100000000000 would lay out 200,000,000,000 episodes"),
    (["eval", "--model", "{d}/model", "--tasks", "rg:leg_counting:4", "--samples", "100000000000"],
     r"--samples 100000000000 would lay out 100,000,000,000 samples of one item"),
    (["design", "--pool", "{d}/pool.jsonl", "--n", "100000000000"], r"--n 100000000000 would lay out"),
    (["warmstart", "--model", "{d}/model", "--pool", "{d}/pool.jsonl", "--epochs", "100000000000"],
     r"--epochs 100000000000 over 1 env\(s\) and --solver-seeds 0 over 0 would lay out 100,000,000,000 samples"),
])
def test_a_count_too_large_for_memory_is_a_usage_error(d: Path, argv: list[str], message: str) -> None:
    """Under an address-space limit, so that a count that did allocate fails here, not on the machine."""
    import resource
    import subprocess
    import sys

    from tests.conftest import WIDE

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    out = d / "out"
    res = subprocess.run([sys.executable, "-m", "spade_cli", *(a.format(d=d) for a in argv), "--out", str(out)],
                         capture_output=True, text=True, env={**os.environ, **WIDE}, preexec_fn=limit, timeout=120)
    _refused(res, 2, message, out)
