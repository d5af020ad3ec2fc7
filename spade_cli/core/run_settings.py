"""The run-level settings of the loop recipes, declared once: name, default, meaning.

A run is described by one settings file (TOML, read with ``tomllib``; the keys are the names below)
that may name its ``base``: another settings file, relative to it, whose keys it overrides, or
``"spade"``, the defaults below (the main arm). Arms of an experiment differ by such a file
(recipes/ablations/*.env, recipes/baselines/*.env). On top of the files, an environment variable of
the same name in upper case overrides a key (``N_ENVS=6 bash recipes/loop.sh``), so one-off
changes need no file. ``CONFIG`` names the files, several separated by ``:`` (later ones win).

    defaults (here) < base < CONFIG file(s), in order < environment (MODEL, N_ENVS, DESIGN_ARGS, ...)

The resolved settings are what ``spade plan`` builds every stage's command line from, and what an
experiment cell records (``spade plan --print-settings``; docs/report.md, "Equal settings").
The Qwen3 sampling defaults of the Designer, the Agent and the evaluation are written here only.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spade_cli.core.errors import UsageError

# The Designer samples in Qwen3's thinking mode with the model card's settings (temperature 0.6,
# top-p 0.95, top-k 20; greedy decoding is advised against). Budgets, spade's choice: 4096 reasoning
# tokens, then 4096 for the answer (the --max-tokens default: a complete env module and its hint);
# a block that runs out is closed by spade and masked out of the Designer's update.
QWEN3_DESIGN = ("--thinking --temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 4096 --answer-tokens 4096"
                " --think-overflow close")
# The Agent as Qwen3 (4B/8B/30B-A3B) runs in thinking mode: the model cards' temperature 0.6, top-p
# 0.95, top-k 20. The budgets are spade's choice for multi-turn play inside rollout's episode context:
# 1024 reasoning and 512 answer tokens a turn; earlier reasoning leaves the context as Qwen3's
# template drops it.
QWEN3_ROLLOUT = ("--temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 1024 --answer-tokens 512"
                 " --think-overflow close --think-context auto")
# Eval samples as the Qwen3 model card evaluates thinking mode: 32768 output tokens ("adequate output
# length"), split into 30720 reasoning and 2048 answer tokens. lm: and evalscope: tasks generate in
# their own harness in one phase and refuse the budgets, so a task list with them gets the sampling only.
QWEN3_EVAL = "--temperature 0.6 --top-p 0.95 --top-k 20"
QWEN3_EVAL_BUDGETS = " --think-tokens 30720 --answer-tokens 2048 --think-overflow close"


@dataclass(frozen=True)
class Setting:
    default: str | int | bool | None
    help: str
    record: bool = True       # part of what an experiment cell's artifacts depend on (settings.json)
    blank: bool = False       # an empty environment value counts (DESIGN_ARGS="" drops the defaults)


S = Setting
SETTINGS: dict[str, Setting] = {
    "model": S(None, "the initial checkpoint (a local directory or a hub id)"),
    "run": S("runs/spade", "the run directory", record=False),
    "iters": S(400, "iterations to reach (the loop stops at iteration ITERS-1)"),
    "n_envs": S(24, "designs per iteration"),
    "group": S(4, "designs per Designer prompt (the Designer's GRPO group)"),
    "k": S(8, "seeds per env; each played hinted and unhinted"),
    "budget_pairs": S(None, "seed pairs the Agent plays an iteration over the valid envs (default N_ENVS*K; "
                            "'': K per env)", blank=True),
    "max_turns": S(16, "turns of an episode"),
    "seed": S(0, "the run's seed"),
    "backend": S("hf", "hf | vllm | openai"),
    "base_url": S("", "the server of BACKEND=openai (a `vllm serve` fleet behind a router)"),
    "corpus": S("", "the grounding corpus (empty: the bundled sample corpus)"),
    "replay": S(0, "past envs replayed per iteration (0: off, as in the paper)"),
    "extra_envs": S("", "validated files played every iteration beside the designs, space-separated"),
    "eval_every": S(25, "evaluate every E iterations, and MODEL itself first (0: never)"),
    "eval_tasks": S("rg:basic_arithmetic:50", "what eval runs"),
    "eval_limit": S("", "examples per eval task (empty: all)"),
    "design_args": S(QWEN3_DESIGN, "extra flags of design, verbatim (setting it, even to '', replaces these)",
                     blank=True),
    "validate_args": S("", "extra flags of validate"),
    "rollout_args": S(QWEN3_ROLLOUT, "extra flags of rollout (setting it, even to '', replaces these)", blank=True),
    "regret_args": S("", "extra flags of regret"),
    "update_args": S("", "extra flags of update", blank=True),
    "eval_args": S(None, "extra flags of eval (default: Qwen3's thinking-mode evaluation; setting it, even to "
                         "'', replaces these)", blank=True),
    "update_cmd": S(None, "the update's launcher (default: SPADE); multi-GPU: "
                          "\"accelerate launch --config_file recipes/accelerate/zero2.yaml -m spade_cli\""),
    "rollout_shards": S(1, ">1: the rollouts come from a Slurm array of that many shards"),
    "pipeline": S(False, "1: pipelined iterations (docs/pipeline.md; off: the paper is on-policy)"),
    "staleness": S(1, "with PIPELINE=1: iteration i samples from checkpoint i-STALENESS"),
    "engine": S("", "serve: one `spade serve` server for the run; empty: each stage loads its own backend"),
    "serve_args": S("", "engine flags of the server, e.g. --tensor-parallel-size 2"),
    "serve_port": S(8000, "the port of ENGINE=serve's server", record=False),
    "gen_devices": S("", "PIPELINE=1: CUDA_VISIBLE_DEVICES of design, rollout and eval", record=False),
    "train_devices": S("", "PIPELINE=1: CUDA_VISIBLE_DEVICES of the update", record=False),
    "prune": S(True, "0: keep every checkpoint and trainer state (spade prune, docs/update.md)", record=False),
    "prune_args": S("", "e.g. --keep-ckpts 3 --keep-state-every 50", record=False),
    "spade": S("spade", "the spade command the stages run", record=False),
    # the arm: what an experiment's arms differ in (only from their files: cells() refuses them in the environment)
    "pool": S("", "a fixed pool instead of the Designer: a pool DIR, FILE.jsonl or rg:NAMES"),
    "frozen_designer": S(False, "1: the Designer stays the initial MODEL and is not trained"),
    "signal": S("regret", "regret | ema_lp | learnability"),
    "grounding": S(True, "0: the Designer writes without a corpus document (ablation)"),
    "memory": S(True, "0: the Designer sees no memory of past envs (ablation)"),
}
ARM = ("pool", "frozen_designer", "signal", "grounding", "memory")
CHOICES = {"backend": ("hf", "vllm", "openai"), "signal": ("regret", "ema_lp", "learnability"),
           "engine": ("", "serve")}


def _coerce(name: str, value: object) -> str | int | bool:
    """A file's or the environment's value as the setting's type; a bad one names the setting."""
    default = SETTINGS[name].default
    env = name.upper()
    if isinstance(default, bool):
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        if str(value).strip() in ("0", "1"):
            return str(value).strip() == "1"
        raise UsageError(f"{env} must be 0 or 1, got {str(value)!r}")
    if isinstance(default, int):
        try:
            number = int(str(value).strip())
        except ValueError:
            raise UsageError(f"{env} must be a whole number, got {str(value)!r}") from None
        return number
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def read_file(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A settings file and its bases, the file's keys winning; ``base = "spade"`` is the defaults."""
    if path in seen:
        raise UsageError(f"{path}: its bases name it again ({' -> '.join(map(str, seen))})")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"settings file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"settings file {path}: not TOML ({exc})") from None
    base = data.pop("base", "spade")
    out = {} if base == "spade" else read_file((path.parent / base).resolve(), (*seen, path))
    for key, value in data.items():
        if key not in SETTINGS:
            raise UsageError(f"settings file {path}: unknown key {key!r} (known: {', '.join(SETTINGS)})")
        out[key] = _coerce(key, value)
    return out


def resolve(env: Mapping[str, str], files: list[Path] | None = None) -> dict:
    """Every setting: the defaults, then the files (default: $CONFIG, ':'-separated), then ``env``."""
    if files is None:
        files = [Path(p) for p in env.get("CONFIG", "").split(":") if p]
    out: dict = {name: s.default for name, s in SETTINGS.items()}
    for path in files:
        out.update(read_file(path))
    for name, s in SETTINGS.items():
        value = env.get(name.upper())
        if value is not None and (value != "" or s.blank):
            out[name] = _coerce(name, value)
    for name, choices in CHOICES.items():
        if out[name] not in choices:
            raise UsageError(f"{name.upper()} must be {' or '.join(c or 'empty' for c in choices)}, got {out[name]!r}")
    if out["staleness"] < 1:
        raise UsageError(f"STALENESS must be a whole number >= 1, got '{out['staleness']}'")
    # defaults that follow other settings
    if out["budget_pairs"] is None:
        out["budget_pairs"] = str(out["n_envs"] * out["k"])
    if out["update_cmd"] is None:
        out["update_cmd"] = out["spade"]
    if out["eval_args"] is None:
        lm = any(t.strip().startswith(("lm:", "evalscope:")) for t in out["eval_tasks"].split(","))
        out["eval_args"] = QWEN3_EVAL + ("" if lm else QWEN3_EVAL_BUDGETS)
    if out["engine"] == "serve":  # every stage samples through the run's server
        out["backend"] = "openai"
        out["base_url"] = out["base_url"] or f"http://127.0.0.1:{out['serve_port']}/v1"
    return out


def recorded(settings: Mapping) -> dict[str, str]:
    """What an experiment cell records (its settings.json): the settings its artifacts depend on,
    by their environment names, as strings (booleans 0/1)."""
    def text(v: object) -> str:
        return str(int(v)) if isinstance(v, bool) else "" if v is None else str(v)
    return {name.upper(): text(settings[name]) for name, s in SETTINGS.items() if s.record}


def model_of(settings: Mapping) -> str:
    if not settings.get("model"):
        raise UsageError("set MODEL to the initial checkpoint (a local directory or a hub id)")
    return str(settings["model"])


def arm_recipe(arm: str, recipes: Path) -> Path:
    """What runs an experiment's arm: recipes/loop.sh (``spade``), its settings file
    (recipes/ablations/NAME.env, recipes/baselines/NAME.env) or its script (recipes/baselines/NAME.sh)."""
    if arm == "spade":
        return recipes / "loop.sh"
    for path in (recipes / "ablations" / f"{arm}.env", recipes / "baselines" / f"{arm}.env",
                 recipes / "baselines" / f"{arm}.sh"):
        if path.is_file():
            return path
    known = sorted({p.stem for d in ("ablations", "baselines") for p in (recipes / d).glob("*.[es][nh]*")})
    raise UsageError(f"experiment.sh: unknown arm {arm!r} (known: spade {' '.join(known)})")


def cells(arms: list[str], seeds: list[str], exp: str, recipes: Path, cell: str = "",
          env: Mapping[str, str] | None = None) -> list[tuple]:
    """The cells of an experiment: cell c is arm c // len(seeds) with seed c % len(seeds), in
    EXP/ARM/seed_S, as (c, arm, seed, run, recipe); ``cell`` picks one (a Slurm array task).
    An arm's own settings (``ARM``) come only from its file: one set in ``env`` would reach every
    cell and override every arm's file, so it is refused (an empty one counts as unset)."""
    if not arms or not seeds:
        raise UsageError("experiment.sh: ARMS and SEEDS must not be empty")
    stray = [f"{name.upper()}={env[name.upper()]}" for name in ARM if (env or {}).get(name.upper())]
    if stray:
        raise UsageError(f"experiment.sh: {' '.join(stray)} is set in the environment, but an arm's own settings "
                         f"({', '.join(n.upper() for n in ARM)}) come only from its file, and this would override "
                         f"every arm's: put it in the experiment's CONFIG file, which every arm reads before its own")
    recipe = {arm: arm_recipe(arm, recipes) for arm in arms}  # every name is checked before any work
    n = len(arms) * len(seeds)
    if cell and (not cell.isdigit() or int(cell) >= n):
        raise UsageError(f"experiment.sh: CELL={cell}, not in 0..{n - 1}")
    picked = [int(cell)] if cell else range(n)
    return [(c, arms[c // len(seeds)], seeds[c % len(seeds)], f"{exp}/{arms[c // len(seeds)]}/seed_{seeds[c % len(seeds)]}",
             recipe[arms[c // len(seeds)]]) for c in picked]
