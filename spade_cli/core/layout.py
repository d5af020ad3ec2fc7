"""The run directory, derived in one place (docs/architecture.md, 'Run layout').

    runs/NAME/
      memory/iter_0007.jsonl            the environment memory as of iteration 7 (written by the
                                        regret of iteration 6; iteration 0 has none unless seeded)
      iter_0007/designs.jsonl           + designs.jsonl.manifest.json, and so on for every stage
      iter_0007/validated.jsonl
      iter_0007/rollouts.jsonl          (or rollouts.shard-00-of-04.jsonl from a Slurm array)
      iter_0007/scores.jsonl
      iter_0007/replay.jsonl            environments replayed in the next iteration (optional)
      iter_0007/lp_before.jsonl         the previous checkpoint's rollouts of iteration 7's envs on
                                        the same seeds (the ema_lp arm; not training data)
      ckpt/iter_0008/                   the checkpoint `spade update` wrote after iteration 7
      eval/iter_0008.jsonl              evaluation of that checkpoint (+ the harness's own files)
      designer_probe/iter_0008/         that checkpoint's designs for one fixed prompt set, played
                                        by one fixed Agent (recipes/designer_probe.sh)
      report/                           `spade report` tables and plots
      loop_mode                         which loop made the run: "sequential" or "pipelined S"
                                        (docs/pipeline.md); the two never mix in one run directory
      serve/server.json                 the run's `spade serve` server: URL, pid, checkpoint
                                        (+ server.log, events.jsonl, current -> the served ckpt)
      serve/node-0/server.json          the same for one server of several (`spade serve --server
                                        node-0`: the multi-node driver's fleet, one per node)
      serve/fleet/job                   the job id of the multi-node driver's fleet (ENGINE=serve);
                                        serve/fleet/JOBID/ holds the driver's load requests and
                                        the servers' answers (docs/slurm.md)

Recipes call ``spade paths RUN_DIR --iteration I`` to read these names instead of spelling them.

Every artifact is written once (docs/architecture.md, 'Write-once files, manifests and resumption'): the memory is versioned like the checkpoint,
``memory`` is what iteration i reads and ``next_memory`` what its regret writes. A rerun of any
stage of any iteration therefore sees exactly the inputs it saw the first time, which is what lets
a loop killed at any point resume to the artifacts of an uninterrupted run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_shard(spec: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N; None -> (0, 1)."""
    if not spec:
        return 0, 1
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like I/N (e.g. 0/4), got {spec!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: need 0 <= I < N")
    return i, n


@dataclass(frozen=True)
class RunLayout:
    root: Path

    def iter_dir(self, i: int) -> Path:
        return self.root / f"iter_{i:04d}"

    def designs(self, i: int) -> Path:
        return self.iter_dir(i) / "designs.jsonl"

    def validated(self, i: int) -> Path:
        return self.iter_dir(i) / "validated.jsonl"

    def rollouts(self, i: int) -> Path:
        return self.iter_dir(i) / "rollouts.jsonl"

    def rollout_shard(self, i: int, shard: int, of: int) -> Path:
        return self.iter_dir(i) / f"rollouts.shard-{shard:02d}-of-{of:02d}.jsonl"

    def rollout_shards_glob(self, i: int, of: int) -> str:
        """Every shard of an ``of``-task array, for counting the finished ones."""
        return str(self.iter_dir(i) / f"rollouts.shard-*-of-{of:02d}.jsonl")

    def rollouts_glob(self, i: int) -> str:
        return str(self.iter_dir(i) / "rollouts*.jsonl")

    def scores(self, i: int) -> Path:
        return self.iter_dir(i) / "scores.jsonl"

    def replay(self, i: int) -> Path:
        return self.iter_dir(i) / "replay.jsonl"

    def lp_before(self, i: int) -> Path:
        """Rollouts of iteration ``i``'s envs by the checkpoint before ``ckpt(i)``: ema_lp's "before"
        (not named rollouts*, so no report or update counts them as the iteration's episodes)."""
        return self.iter_dir(i) / "lp_before.jsonl"

    def memory(self, i: int) -> Path:
        """The memory iteration ``i`` reads (written by the regret of iteration i-1)."""
        return self.root / "memory" / f"iter_{i:04d}.jsonl"

    def ckpt(self, i: int) -> Path:
        """The checkpoint used by iteration ``i`` (written by the update of iteration i-1)."""
        return self.root / "ckpt" / f"iter_{i:04d}"

    def eval(self, i: int) -> Path:
        return self.root / "eval" / f"iter_{i:04d}.jsonl"

    def designer_probe(self, i: int) -> Path:
        """Checkpoint ``i``'s designs for one fixed prompt set, played by one fixed Agent (designs,
        validated, rollouts, scores .jsonl; recipes/designer_probe.sh); 0 is the starting model."""
        return self.root / "designer_probe" / f"iter_{i:04d}"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def loop_mode(self) -> Path:
        return self.root / "loop_mode"

    @property
    def serve_dir(self) -> Path:
        return self.root / "serve"

    def serve_state_dir(self, server: str | None = None) -> Path:
        """Where ``spade serve`` keeps a server's state: RUN/serve/ for the run's one server,
        RUN/serve/NAME/ for one of several (a fleet's node-0, node-1, ...)."""
        if not server:
            return self.serve_dir
        if not SERVER_NAME.fullmatch(server) or server == "fleet":
            raise ValueError(f"--server {server!r}: a name of letters, digits, '.', '_' or '-' (not 'fleet')")
        return self.serve_dir / server

    @property
    def serve_fleet(self) -> Path:
        return self.serve_dir / "fleet"

    def iterations(self) -> list[int]:
        return sorted(int(p.name[5:]) for p in self.root.glob("iter_[0-9][0-9][0-9][0-9]") if p.is_dir())

    def as_dict(self, i: int, shard: tuple[int, int] | None = None) -> dict[str, str]:
        """Every path of iteration ``i``; with ``shard=(s, n)`` also task s's shard of an n-task array."""
        table = {
            "iter_dir": str(self.iter_dir(i)), "designs": str(self.designs(i)),
            "validated": str(self.validated(i)), "rollouts": str(self.rollouts(i)),
            "rollouts_glob": self.rollouts_glob(i), "scores": str(self.scores(i)),
            "replay": str(self.replay(i)), "prev_replay": str(self.replay(i - 1)) if i > 0 else "",
            "memory": str(self.memory(i)),
            "next_memory": str(self.memory(i + 1)), "ckpt": str(self.ckpt(i)),
            "next_ckpt": str(self.ckpt(i + 1)), "prev_ckpt": str(self.ckpt(i - 1)) if i > 0 else "",
            "lp_before": str(self.lp_before(i)), "eval": str(self.eval(i)),
            "next_eval": str(self.eval(i + 1)), "designer_probe": str(self.designer_probe(i)),
            "report_dir": str(self.report_dir), "loop_mode": str(self.loop_mode),
            "serve_state": str(self.serve_dir / "server.json"), "serve_fleet": str(self.serve_fleet),
        }
        if shard is not None:
            table["rollout_shard"] = str(self.rollout_shard(i, *shard))
            table["rollout_shards_glob"] = self.rollout_shards_glob(i, shard[1])
        return table
