"""Every example that help shows runs as written.

An example is a ``[bold]...[/]`` span of the help text of ``spade`` or of a command (its docstring
or epilog). Each one is either in ``RUNS`` — run by bash, in that order, in one temporary directory,
so an example may read what an earlier one wrote — or in ``NOT_RUNNABLE`` with the reason; a new
or changed example that is in neither fails ``test_every_example_is_run_or_listed``.

What the runs change, and nothing else:
- ``spade`` is this checkout's ``python -m spade_cli`` (a shell function), so the examples run
  against the code under test whatever ``spade`` is on PATH.
- ``SUBSTITUTE``: a checkpoint a machine like this one cannot train in minutes becomes the tiny
  one that the init-model example writes (``ckpt/tiny``).
- ``runs/demo``, the run directory several examples name, is made by ``recipes/loop.sh`` (one
  iteration of the tiny model, the knobs of tests/test_loop.py, an evaluation before and after)
  before the first example that reads it.

The examples that need no model run in the default tiers; the whole chain (a model, the loop) is
``slow``. Which option names the examples use is checked in the default tiers without running them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from spade_cli.app import app
from tests.conftest import REPO, WIDE

GROUP = get_command(app)
COMMANDS = dict(GROUP.commands)

# In pipeline order. True: needs no model, so it runs in the default tiers too (after the earlier
# True ones only).
RUNS: list[tuple[str, bool]] = [
    ("spade init-model --out ckpt/tiny --size tiny", False),
    ("spade design --pool bundled --n 8 --out designs.jsonl", True),
    ("spade validate --designs designs.jsonl --out validated.jsonl --workers 2", True),
    ("spade rollout --model ckpt/tiny --envs validated.jsonl --k 2 --max-turns 2 --max-tokens 32 "
     "--out rollouts.jsonl", False),
    ("spade regret --envs validated.jsonl --rollouts 'rollouts*.jsonl' --out scores.jsonl "
     "--memory-out memory/iter_0001.jsonl --replay 4 --replay-out replay.jsonl", False),
    ("spade update --model ckpt/tiny --envs validated.jsonl --rollouts 'rollouts*.jsonl' --scores scores.jsonl "
     "--out ckpt/iter_0001", False),
    ("spade design --model ckpt/tiny --n 8 --group 4 --max-tokens 64 --memory runs/demo/memory/iter_0001.jsonl "
     "--iteration 1 --out runs/demo/iter_0001/designs.jsonl", False),
    ("spade eval --model ckpt/tiny --tasks rg:basic_arithmetic:4,lm:spade_tiny_qa --max-tokens 16 --out eval.jsonl",
     False),
    ("spade eval --compare runs/demo/eval/iter_0000.jsonl runs/demo/eval/iter_0001.jsonl", False),
    ("spade warmstart --model ckpt/small --out ckpt/warm --epochs 12 --max-examples 6", False),
    ("spade inspect 'rollouts*.jsonl' --where hinted=false --row 0", False),
    ("spade paths runs/demo -i 3 --key validated", True),
    ('eval "$(spade paths runs/demo -i 3 --shell)"', True),
    ("spade paths runs/demo -i 3 --shard 2/16 --key rollout_shard", True),
    ("MODEL=ckpt/tiny RUN=runs/demo spade plan -i 0 --json", True),
    ('eval "$(MODEL=ckpt/tiny RUN=runs/demo spade plan -i 0 --shell)"', True),
    ("spade doctor", True),
    ("spade doctor --json | jq .tier", True),
    ("spade report runs/demo", False),
    ("spade report runs/demo --no-plots --report-to tensorboard", False),
    ("spade prune runs/demo -i 7 --eval-every 25", False),
    ("spade serve --run-dir runs/demo --model runs/demo/ckpt/iter_0001 --dry-run", False),
]
NOT_RUNNABLE = {
    "spade serve --run-dir runs/demo --do sleep": "needs a running vLLM server (GPU)",
    "spade compare runs/exp": "needs an experiment's arms x seeds of full runs (recipes/experiment.sh)",
    "EXP=runs/exp bash recipes/experiment.sh": "several full runs per arm: hours, and GPUs for the paper's setting",
}
# What an example promises beyond its exit status, checked in the same shell right after it.
THEN = {'eval "$(spade paths runs/demo -i 3 --shell)"': 'test -n "$designs" -a -n "$memory" -a -n "$next_ckpt"',
        'eval "$(MODEL=ckpt/tiny RUN=runs/demo spade plan -i 0 --shell)"': 'test "$iteration" = 0 -a -n "$log"',
        "spade doctor --json | jq .tier": "spade doctor --json | jq -e .tier"}
# warmstart's example names the 13M-parameter model of the quickstart; the tiny one stands in.
SUBSTITUTE = {"ckpt/small": "ckpt/tiny"}
# The loop that makes runs/demo (tests/test_loop.py's small knobs; EVAL_EVERY=1 evaluates the model
# it starts from and the checkpoint it ends with).
LOOP = {"RUN": "runs/demo", "MODEL": "ckpt/tiny", "ITERS": "1", "N_ENVS": "2", "GROUP": "2", "K": "2",
        "MAX_TURNS": "2", "EVAL_EVERY": "1", "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2",
        "EVAL_ARGS": "--max-tokens 4 --batch-size 2", "PRUNE": "0",
        "DESIGN_ARGS": "--max-tokens 6 --no-example --excerpt-chars 60 --memory-k 2",
        "ROLLOUT_ARGS": "--max-tokens 8", "UPDATE_ARGS": "--learning-rate 1e-3"}


def help_examples() -> dict[str, list[str]]:
    """{command ('' for `spade` itself): its examples, whitespace folded} from the help as shown."""
    texts = {"": [GROUP.help, GROUP.epilog]} | {n: [c.help, c.epilog] for n, c in COMMANDS.items()}
    return {name: [" ".join(m.split()) for t in parts if t for m in re.findall(r"\[bold\](.*?)\[/\]", t, re.S)]
            for name, parts in texts.items()}


def _all_examples() -> list[str]:
    return [e for examples in help_examples().values() for e in examples]


def _calls(example: str) -> list[tuple[str, list[str]]]:
    """(command, its arguments) for each `spade CMD ...` in an example (in `$(...)` or a pipe too)."""
    calls = []
    for m in re.finditer(r"\bspade ([a-z][a-z-]*)([^|;&)\"]*)", example):
        calls.append((m[1], shlex.split(m[2])))
    return calls


# -- default tier: the examples are all accounted for and use options that exist -------------------

@pytest.mark.unit
def test_every_example_is_run_or_listed() -> None:
    shown = _all_examples()
    listed = [e for e, _ in RUNS] + list(NOT_RUNNABLE)
    assert not set(shown) - set(listed), ("an example in help is neither in RUNS (in pipeline order) nor in "
                                          f"NOT_RUNNABLE (with the reason): {sorted(set(shown) - set(listed))}")
    assert not set(listed) - set(shown), f"no longer in help: {sorted(set(listed) - set(shown))}"
    assert len(shown) == len(set(shown)), "an example appears twice"


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_shows_an_example(name: str) -> None:
    assert any(c == name for e in help_examples()[name] for c, _ in _calls(e)), f"`spade {name} --help` has no example"


@pytest.mark.unit
@pytest.mark.parametrize("example", _all_examples())
def test_an_example_names_only_options_that_exist(example: str) -> None:
    for command, args in _calls(example):
        assert command in COMMANDS, f"{example}: no command {command}"
        params = COMMANDS[command].params
        opts = {o: p for p in params for o in (*p.opts, *p.secondary_opts)}
        for i, arg in enumerate(args):
            name = arg.split("=", 1)[0]
            if not name.startswith("-"):
                continue
            assert name in opts, f"{example}: `spade {command}` has no option {name}"
            choices = getattr(opts[name].type_descriptor, "choices", None)
            if choices and not opts[name].is_flag:
                value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
                assert value in map(str, choices), f"{example}: {name} takes one of {choices}, not {value}"


@pytest.mark.unit
def test_the_option_check_finds_a_wrong_name_and_a_retired_one() -> None:
    with pytest.raises(AssertionError, match="has no option --no-such"):
        test_an_example_names_only_options_that_exist("spade design --pool bundled --no-such 1")
    with pytest.raises(AssertionError, match="has no option --designs"):
        test_an_example_names_only_options_that_exist("spade update --model m --designs v.jsonl --out o")
    with pytest.raises(AssertionError, match="takes one of"):
        test_an_example_names_only_options_that_exist("spade rollout --model m --batching sometimes")
    assert _calls('eval "$(spade paths runs/demo -i 3 --shell)"') == [("paths", ["runs/demo", "-i", "3", "--shell"])]


# -- running them ---------------------------------------------------------------------------------

def _run(example: str, cwd: Path) -> None:
    script = example
    for old, new in SUBSTITUTE.items():
        script = script.replace(old, new)
    script += f"\n{THEN.get(example, '')}\n"
    spade = f'spade() {{ {shlex.quote(sys.executable)} -m spade_cli "$@"; }}\n'
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", spade + script], cwd=cwd, capture_output=True,
                         text=True, env={**os.environ, **WIDE}, timeout=900)
    assert res.returncode == 0, f"`{example}` failed ({res.returncode}):\n{res.stderr[-4000:]}"
    assert "Traceback" not in res.stderr, res.stderr[-4000:]


def _loop(cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **LOOP}
    res = subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]


def _needs_jq(example: str) -> bool:
    return "| jq" in example and shutil.which("jq") is None


@pytest.mark.integration
def test_the_examples_without_a_model_run_as_written(tmp_path: Path) -> None:
    for example, quick in RUNS:
        if quick and not _needs_jq(example):
            _run(example, tmp_path)
    assert (tmp_path / "validated.jsonl").exists()


@pytest.mark.integration
@pytest.mark.slow  # a model, a loop iteration, every stage: minutes on 2 cores
@pytest.mark.timeout(3600)
def test_every_runnable_example_runs_as_written_in_pipeline_order(tmp_path: Path) -> None:
    looped = False
    for example, _ in RUNS:
        if not looped and any("runs/demo" in " ".join(args) and c != "paths" for c, args in _calls(example)):
            _loop(tmp_path)
            looped = True
        if _needs_jq(example):
            continue
        _run(example, tmp_path)
    assert looped and (tmp_path / "ckpt" / "iter_0001").is_dir() and (tmp_path / "runs/demo/report").is_dir()
