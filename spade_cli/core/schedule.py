"""The loop's schedule, in one place: what every iteration of a run runs, with which checkpoint.

The recipes (recipes/loop.sh, recipes/loop_pipelined.sh, the multi-node driver) ask ``spade plan``
for one iteration at a time and run the commands it gives; this module is what it answers from.
Given the resolved settings (``spade_cli.core.run_settings``), the run's layout and which outputs
exist (a manifest means done), ``iteration`` returns every stage call of iteration ``i`` as a
complete argv, an empty list where there is nothing to run:

- the sampler: iteration i samples from checkpoint i (sequential, on-policy as in the paper) or
  from checkpoint max(i - STALENESS, 0) (pipelined, docs/pipeline.md); checkpoint 0 is MODEL. The
  Designer samples from the sampler too, or stays MODEL (FROZEN_DESIGNER).
- the evaluation points: checkpoint c is evaluated when EVAL_EVERY > 0 and c is 0 (MODEL, before
  any update), a multiple of EVAL_EVERY, or ITERS (the last). The sequential loop evaluates MODEL
  first (``eval_model``) and checkpoint i+1 after update(i) (``eval``); the pipelined loop evaluates
  checkpoint i beside update(i) (``eval``), as soon as update(i-1) has written it, and ``iteration
  ITERS`` holds only the last one.
- ema_lp: from the sampler's first update on, the checkpoint before the sampler plays the same envs
  on the same seeds (``lp_rollout``), which regret reads as --before-rollouts.
- replay and EXTRA_ENVS are played beside the designs and passed to regret as --played.
- a pool or a frozen Designer: the update trains the Agent only (--designer-share 0).
- ENGINE=serve: ``before_NAME`` has the run's server load the checkpoint stage NAME samples (or
  sleep before the update) when NAME still has work to do.

Sequentially, a finished iteration (its checkpoint, and its evaluation when due) has nothing to
run; pipelined, a generated iteration (its scores) runs no generation and an updated one no update.
The run directory holds one mode ("sequential" or "pipelined S", RUN/loop_mode): ``check_mode``
records it and refuses the other. Nothing here prints; ``spade plan`` renders the answer.

    iteration(settings, RunLayout(Path("runs/demo")), 3)["rollout"]
    # ['spade', 'rollout', '--model', 'runs/demo/ckpt/iter_0003', '--envs', ...]
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping

from spade_cli.core.artifacts import atomic_write_text, manifest_path
from spade_cli.core.errors import UsageError
from spade_cli.core.layout import RunLayout

Plan = dict[str, object]   # scalars (str) and argv lists


def mode_of(s: Mapping) -> str:
    return f"pipelined {s['staleness']}" if s["pipeline"] else "sequential"


def check_mode(s: Mapping, layout: RunLayout) -> str:
    """Record the run directory's loop mode on its first run; refuse a directory of the other mode.
    A directory with iterations and no record was made before modes were recorded: sequential."""
    mode, path = mode_of(s), layout.loop_mode
    if path.exists():
        recorded = path.read_text().strip()
    elif layout.iterations() or list(layout.root.glob("ckpt/iter_[0-9]*")):
        recorded = "sequential"
    else:
        recorded = mode
    if recorded != mode:
        raise UsageError(f"{layout.root} was made by the {recorded} loop and this is the {mode} one "
                         f"(PIPELINE={int(s['pipeline'])} STALENESS={s['staleness']}): the two never mix in one run "
                         "directory; use another RUN or the same settings")
    if not path.exists():
        atomic_write_text(path, mode + "\n")
    return mode


def gpu_ids(environ: Mapping[str, str]) -> list[str]:
    """The GPUs this process may use, as CUDA sees them (CUDA_VISIBLE_DEVICES, else nvidia-smi)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        v = environ["CUDA_VISIBLE_DEVICES"]
        return [] if v.startswith("-") else [d for d in v.split(",") if d]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(n) for n in range(sum(line.startswith("GPU ") for line in out.splitlines()))]


def check_lanes(s: Mapping, gpus: list[str]) -> None:
    """The pipelined loop on one machine: its server (ENGINE=serve) holds GEN_DEVICES for the whole
    run and never sleeps while the update trains, so with GPUs each lane needs its own; its rollouts
    are its own (a Slurm array is the multi-node driver's)."""
    if not s["pipeline"]:
        return
    if s["rollout_shards"] > 1:
        raise UsageError("PIPELINE=1 plays rollouts in this loop; a rollout array is "
                         "recipes/slurm/multi_node/driver.sh's (PIPELINE=1 there too)")
    if s["engine"] != "serve":
        return
    gen, train = (str(s[k]) for k in ("gen_devices", "train_devices"))
    shared = [d for d in gen.split(",") if d and d in train.split(",")]
    if (gen and train and not shared) or (not gen and not train and not gpus):
        return  # disjoint lanes, or the CPU: no device memory to split
    n, half = len(gpus), (len(gpus) + 1) // 2
    if n >= 2:
        fix = (f"give each lane its own GPUs, e.g. GEN_DEVICES={','.join(gpus[:half])} "
               f"TRAIN_DEVICES={','.join(gpus[half:])} (and UPDATE_CMD's --num_processes to match; "
               "recipes/slurm/single_node.sbatch splits the node by TRAIN_GPUS)")
    elif n == 1:
        fix = "one GPU cannot hold both: run ENGINE=serve sequentially (PIPELINE=0; its server sleeps during the update)"
    else:
        fix = "on CPU set neither, elsewhere both, disjoint"
    both = f"; both have {' '.join(shared)}" if shared else ""
    raise UsageError("ENGINE=serve with PIPELINE=1: the server holds GEN_DEVICES for the whole run while the update "
                     f"trains on TRAIN_DEVICES, and here the two would share devices (GEN_DEVICES={gen or 'all'} "
                     f"TRAIN_DEVICES={train or 'all'}{both}): {fix}")


def ckpt_of(s: Mapping, layout: RunLayout, c: int) -> str:
    """Checkpoint c: MODEL for 0, else what update(c-1) wrote."""
    return str(s["model"]) if c <= 0 else str(layout.ckpt(c))


def sampler_of(s: Mapping, i: int) -> int:
    """The checkpoint iteration i samples from: i, or i - STALENESS when pipelined (never before 0)."""
    return max(i - s["staleness"], 0) if s["pipeline"] else i


def eval_due(s: Mapping, c: int) -> bool:
    """Whether checkpoint c is an evaluation point: MODEL, every EVAL_EVERY-th, and the last."""
    e = s["eval_every"]
    return e > 0 and (c == 0 or c % e == 0 or c == s["iters"])


def _split(flags: str) -> list[str]:
    return shlex.split(flags or "")


class _Iteration:
    """The commands of iteration i; ``done(path)`` says whether an output's manifest exists."""

    def __init__(self, s: Mapping, layout: RunLayout, i: int, done: Callable[[str], bool],
                 exists: Callable[[str], bool], shard: tuple[int, int] | None):
        self.s, self.layout, self.i, self.done, self.exists, self.shard = s, layout, i, done, exists, shard
        self.p = layout.as_dict(max(i, 0), shard)
        self.spade = _split(s["spade"])
        self.backend = ["--backend", s["backend"], *(["--base-url", s["base_url"]] if s["base_url"] else [])]
        self.gen_env = (["env", f"CUDA_VISIBLE_DEVICES={s['gen_devices']}"]
                        if s["pipeline"] and s["gen_devices"] else [])

    def on_gen(self, argv: list[str]) -> list[str]:
        """A stage of the generation lane (everything but the update): on GEN_DEVICES when pipelined."""
        return [*self.gen_env, *argv] if argv else []

    def serve_load(self, ckpt: str, it: int, out: str | None) -> list[str]:
        if self.s["engine"] != "serve" or (out is not None and self.done(out)):
            return []
        never_sleep = ["--no-sleep-mode"] if self.s["pipeline"] else []
        return self.on_gen([*self.spade, "serve", "--run-dir", str(self.layout.root), "--model", ckpt, "--port",
                            str(self.s["serve_port"]), "--iteration", str(it), *never_sleep,
                            *_split(self.s["serve_args"])])

    def evaluate(self, c: int, out: str) -> list[str]:
        s = self.s
        limit = ["--limit", str(s["eval_limit"])] if s["eval_limit"] else []
        return self.on_gen([*self.spade, "eval", "--model", ckpt_of(s, self.layout, c), "--tasks", s["eval_tasks"],
                            *self.backend, *limit, "--out", out, *_split(s["eval_args"])])

    def generation(self, plan: Plan) -> None:
        s, p, i = self.s, self.p, self.i
        model = str(s["model"])
        sampler = ckpt_of(s, self.layout, sampler_of(s, i))
        designer = model if s["frozen_designer"] else sampler
        plan.update(sampler=sampler, designer=designer)
        memory = [p["memory"]] if self.exists(p["memory"]) else []
        if s["pool"]:
            design = ["--pool", s["pool"]]
        else:
            corpus = (["--corpus", s["corpus"]] if s["corpus"] else []) if s["grounding"] else ["--no-grounding"]
            design = ["--model", designer, "--group", str(s["group"]), "--signal", s["signal"], *self.backend,
                      *corpus, *(["--memory", *memory] if s["memory"] and memory else [])]
            plan["before_design"] = self.serve_load(designer, i, p["designs"])
        plan["design"] = self.on_gen([*self.spade, "design", *design, "--n", str(s["n_envs"]), "--iteration", str(i),
                                      "--seed", str(s["seed"]), "--out", p["designs"], *_split(s["design_args"])])
        plan["validate"] = self.on_gen([*self.spade, "validate", "--designs", p["designs"], "--out", p["validated"],
                                        *(["--memory", *memory] if memory and not s["pool"] else []),
                                        *_split(s["validate_args"])])
        # replays and the fixed set are played and trained on, never scored as designs (docs/regret.md)
        extra = [p["prev_replay"]] if i > 0 and self.exists(p["prev_replay"]) else []
        extra += s["extra_envs"].split()
        envs = [a for e in [p["validated"], *extra] for a in ("--envs", e)]
        played = [a for e in extra for a in ("--played", e)]
        budget = ["--budget-pairs", str(s["budget_pairs"])] if s["budget_pairs"] != "" else []

        def rollout(model_: str, out: str, shard: list[str]) -> list[str]:
            return self.on_gen([*self.spade, "rollout", "--model", model_, *envs, "--k", str(s["k"]), "--max-turns",
                                str(s["max_turns"]), "--iteration", str(i), "--seed", str(s["seed"]), *self.backend,
                                *budget, *shard, "--out", out, *_split(s["rollout_args"])])

        rollouts = self.rollouts()
        if self.shard is not None:  # one task of a rollout array
            plan["rollout"] = rollout(sampler, p["rollout_shard"], ["--shard", f"{self.shard[0]}/{self.shard[1]}"])
        elif s["rollout_shards"] > 1:  # the array writes them (recipes/slurm/); this iteration waits for all
            n = s["rollout_shards"]
            have = sum(self.done(str(self.layout.rollout_shard(i, k, n))) for k in range(n))
            if have < n:
                plan["wait_shards"] = f"waiting for {n} rollout shards of iteration {i} ({have} done); submit the array"
        else:
            plan["rollout"] = rollout(sampler, rollouts, [])
            plan["before_rollout"] = self.serve_load(sampler, i, rollouts)
        before_lp = []
        if s["signal"] == "ema_lp" and sampler_of(s, i) >= 1:
            before = ckpt_of(s, self.layout, sampler_of(s, i) - 1)
            plan["lp_rollout"] = rollout(before, p["lp_before"], [])
            plan["before_lp_rollout"] = self.serve_load(before, i, p["lp_before"])
            before_lp = ["--before-rollouts", p["lp_before"]]
        replay = ["--replay", str(s["replay"]), "--replay-out", p["replay"]] if s["replay"] > 0 else []
        plan["regret"] = self.on_gen([*self.spade, "regret", "--envs", p["validated"], *played, "--rollouts", rollouts,
                                      "--out", p["scores"], "--signal", s["signal"], "--iteration", str(i),
                                      "--memory-out", p["next_memory"], *before_lp,
                                      *(["--memory", *memory] if memory else []), *replay,
                                      *_split(s["regret_args"])])

    def rollouts(self) -> str:
        """What regret and the update read: the rollouts, or every shard of the iteration's array."""
        n = self.shard[1] if self.shard is not None else self.s["rollout_shards"]
        return self.layout.rollout_shards_glob(self.i, n) if n > 1 else self.p["rollouts"]

    def update(self, plan: Plan) -> None:
        s, p, i = self.s, self.p, self.i
        rollouts = self.rollouts()
        stale = ["--max-staleness", str(s["staleness"])] if s["pipeline"] else []
        agent_only = ["--designer-share", "0"] if s["pool"] or s["frozen_designer"] else []
        train_env = ["env", f"CUDA_VISIBLE_DEVICES={s['train_devices']}"] if s["pipeline"] and s["train_devices"] else []
        plan["update"] = [*train_env, *_split(s["update_cmd"]), "update", "--model", ckpt_of(s, self.layout, i),
                          "--envs", p["validated"], "--rollouts", rollouts, "--scores", p["scores"],
                          "--out", p["next_ckpt"], *stale, *agent_only, *_split(s["update_args"])]
        if s["engine"] == "serve" and not s["pipeline"] and not self.done(p["next_ckpt"]):
            # level 2 drops the weights rather than parking them in host memory: the next load reads
            # a new checkpoint anyway
            plan["before_update"] = [*self.spade, "serve", "--run-dir", str(self.layout.root), "--do", "sleep",
                                     "--level", "2", "--iteration", str(i)]
        if s["prune"]:  # retention, once the update (and its evaluation) are written (docs/update.md)
            plan["prune"] = self.on_gen([*self.spade, "prune", str(self.layout.root), "-i", str(i), "--eval-every",
                                         str(s["eval_every"]), *_split(s["prune_args"])])


NAMES = ("eval_model", "design", "validate", "rollout", "lp_rollout", "regret", "update", "eval", "prune")


def iteration(s: Mapping, layout: RunLayout, i: int, *, shard: tuple[int, int] | None = None,
              done: Callable[[str], bool] | None = None, exists: Callable[[str], bool] | None = None) -> Plan:
    """Every stage call of iteration ``i`` (``NAMES``, and ``before_NAME`` for ENGINE=serve), argv lists,
    empty where there is nothing to run, with scalars: ``ckpt``, ``next_ckpt``, ``sampler``, ``designer``,
    ``done``, ``eval_due``, ``log`` (and pipelined ``updated``, ``log_update``; ``wait_shards``).

    ``done(path)``: the output's manifest exists (default: on disk); ``exists(path)``: the file does."""
    done = done or (lambda path: manifest_path(path).exists())
    exists = exists or os.path.exists
    it = _Iteration(s, layout, i, done, exists, shard)
    iters, p = s["iters"], it.p
    plan: Plan = {name: [] for name in NAMES}
    plan.update({f"before_{name}": [] for name in NAMES})
    plan.update(iteration=str(i), ckpt=ckpt_of(s, layout, i), next_ckpt=p["next_ckpt"], sampler="", designer="",
                eval_due="0", done="0", log="", wait_shards="", mode=mode_of(s))
    if not s["pipeline"]:
        if i == 0 and eval_due(s, 0) and not done(p["eval"]):  # the curve's start: MODEL, before any update
            plan["eval_model"] = it.evaluate(0, p["eval"])
            plan["before_eval_model"] = it.serve_load(str(s["model"]), 0, None)
        due = eval_due(s, i + 1) and i < iters
        finished = i >= iters or (done(p["next_ckpt"]) and (not due or done(p["next_eval"])))
        plan.update(eval_due=str(int(due)), done=str(int(finished)))
        if finished:
            plan["log"] = f"iteration {i}: done"
            return plan
        plan["log"] = f"iteration {i} (model: {plan['ckpt']})"
        it.generation(plan)
        it.update(plan)
        if due:
            plan["eval"] = it.evaluate(i + 1, p["next_eval"])
            plan["before_eval"] = it.serve_load(p["next_ckpt"], i + 1, p["next_eval"])
        return plan
    # pipelined: the generation of i, the update of i, and the evaluation of checkpoint i
    if eval_due(s, i) and not done(str(layout.eval(i))):
        plan["eval"] = it.evaluate(i, str(layout.eval(i)))
        plan["before_eval"] = it.serve_load(ckpt_of(s, layout, i), i, None)
        plan["eval_due"] = "1"
    if i >= iters:
        plan.update(done="1", updated="1", log_update="")
        return plan
    if done(p["scores"]):
        plan["log"] = f"iteration {i}: generated"
    else:
        it.generation(plan)
        plan["log"] = f"iteration {i}: generating with {plan['sampler']}"
    updated = done(p["next_ckpt"])
    plan["updated"] = str(int(updated))
    plan["done"] = str(int(updated and plan["log"].endswith("generated")))
    it.update(plan)
    if updated:
        plan["update"] = []
    plan["log_update"] = f"update of iteration {i}: done" if updated else f"update of iteration {i} (from {plan['ckpt']})"
    return plan


def start(s: Mapping, layout: RunLayout) -> Plan:
    """What a loop needs once: its mode recorded and checked, the banner, the range, and the calls at
    its end (the server stopped, the report)."""
    mode = check_mode(s, layout)
    spade = _split(s["spade"])
    stop = [*spade, "serve", "--run-dir", str(layout.root), "--do", "stop"] if s["engine"] == "serve" else []
    banner = (f"spade loop ({mode}): RUN={layout.root} MODEL={s['model']} ITERS={s['iters']} N_ENVS={s['n_envs']} "
              f"GROUP={s['group']} K={s['k']} BACKEND={s['backend']} SIGNAL={s['signal']} "
              f"GROUNDING={int(s['grounding'])} MEMORY={int(s['memory'])} REPLAY={s['replay']} "
              f"POOL={s['pool'] or 'none'} FROZEN_DESIGNER={int(s['frozen_designer'])} EVAL_EVERY={s['eval_every']} "
              f"SEED={s['seed']} ENGINE={s['engine'] or 'per-stage'}")
    if s["pipeline"]:
        banner += f" GEN_DEVICES={s['gen_devices'] or 'all'} TRAIN_DEVICES={s['train_devices'] or 'all'}"
    return {"mode": mode, "banner": banner, "run": str(layout.root), "iters": str(s["iters"]),
            "pipeline": str(int(s["pipeline"])), "staleness": str(s["staleness"]), "engine": s["engine"],
            "stop_server": stop, "report": [*spade, "report", str(layout.root)]}
