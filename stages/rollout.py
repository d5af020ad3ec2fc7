"""`spade rollout`: play every valid environment k times without the hint and k times with it.

Input: ``spade.validation/1`` rows (``--envs``: this iteration's validated designs, a replay file,
a fixed set). Output: one ``spade.rollout/1`` row per episode, written as episodes finish, with
its manifest; a rerun after a kill plays only the missing episodes.

The stage is the library's ``spade_cli.rollout.play_envs.run`` as it stands: that function checks
the settings and the output, plays the episodes and publishes the file, and `spade eval` runs the
same function on its held-out suites. Seeds, sharding and batching are described there.

    spade rollout --model ckpt/iter_0003 --envs validated.jsonl --k 8 --out rollouts.jsonl
"""

from __future__ import annotations

from spade_cli.core.layout import parse_shard
from spade_cli.rollout.play_envs import BATCHING, in_shard, load_envs, resolve_batching, run

__all__ = ["BATCHING", "in_shard", "load_envs", "parse_shard", "resolve_batching", "run"]
