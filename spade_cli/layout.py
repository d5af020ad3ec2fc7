"""The run directory, derived in one place (DESIGN §7).

    runs/NAME/
      memory.jsonl                      environment memory across iterations
      iter_0007/designs.jsonl           + designs.jsonl.manifest.json, and so on for every stage
      iter_0007/validated.jsonl
      iter_0007/rollouts.jsonl          (or rollouts.shard-00-of-04.jsonl from a Slurm array)
      iter_0007/scores.jsonl
      iter_0007/replay.jsonl            environments replayed in the next iteration (optional)
      ckpt/iter_0008/                   the checkpoint `spade update` wrote after iteration 7
      eval/iter_0008.jsonl              evaluation of that checkpoint (+ the harness's own files)
      report/                           `spade report` tables and plots

Recipes call ``spade paths RUN_DIR --iteration I`` to read these names instead of spelling them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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

    def rollouts_glob(self, i: int) -> str:
        return str(self.iter_dir(i) / "rollouts*.jsonl")

    def scores(self, i: int) -> Path:
        return self.iter_dir(i) / "scores.jsonl"

    def replay(self, i: int) -> Path:
        return self.iter_dir(i) / "replay.jsonl"

    @property
    def memory(self) -> Path:
        return self.root / "memory.jsonl"

    def ckpt(self, i: int) -> Path:
        """The checkpoint used by iteration ``i`` (written by the update of iteration i-1)."""
        return self.root / "ckpt" / f"iter_{i:04d}"

    def eval(self, i: int) -> Path:
        return self.root / "eval" / f"iter_{i:04d}.jsonl"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    def iterations(self) -> list[int]:
        return sorted(int(p.name[5:]) for p in self.root.glob("iter_[0-9][0-9][0-9][0-9]") if p.is_dir())

    def as_dict(self, i: int) -> dict[str, str]:
        return {
            "iter_dir": str(self.iter_dir(i)), "designs": str(self.designs(i)),
            "validated": str(self.validated(i)), "rollouts": str(self.rollouts(i)),
            "rollouts_glob": self.rollouts_glob(i), "scores": str(self.scores(i)),
            "replay": str(self.replay(i)), "memory": str(self.memory), "ckpt": str(self.ckpt(i)),
            "next_ckpt": str(self.ckpt(i + 1)), "eval": str(self.eval(i)),
            "report_dir": str(self.report_dir),
        }
