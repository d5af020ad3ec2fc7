"""Benchmark: `spade update`'s pass with padded micro-batches next to packed ones, on rollout-like row lengths.

Rows are drawn like multi-turn rollouts: a prompt of 200-600 tokens and a completion of 50-3000
(log-normal, median 450, so most rows are short and a few are long), made of agent replies
with environment observations between them (``env_mask`` 0, trained by nobody). Both layouts
run the same samples in the same micro-batches through spade's own pass
(``spade_cli.training.trainer.train_pass``: old log-probs, then forward, GRPO loss, backward and AdamW
step per micro-batch), ``--packing off`` against ``--packing on``, alternating, after one
untimed warm-up each; model loading is excluded. Printed: the padding share of each layout
(tokens the model computes that belong to no row; also counted, without a model, over
``--share-rows`` rows of the same distribution), the attention scores each computes (padded:
every row to the micro-batch's longest; packed: each row its own length squared), tokens/s of
each (real tokens, as update.json counts them) and their ratio, the ratio of the passes' CPU
time (with one thread, what a busy shared machine cannot skew: wall seconds there swing by
several times between repeats), and the largest difference of the old log-probs between the
layouts.

    .venv/bin/python recipes/bench_packing.py                 # tiny model, built offline
    .venv/bin/python recipes/bench_packing.py --size small --rows 8
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(rng.lognormvariate(math.log(median), sigma))))


def draw_samples(n: int, vocab: int, group: int, seed: int) -> list:
    """Rows like multi-turn episodes: replies and observations alternate up to a skewed length."""
    from spade_cli.training.grpo import Sample

    rng = random.Random(seed)
    tok = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731  (0-2: special ids)
    samples = []
    for i in range(n):
        target = _lognormal(rng, 450, 0.9, 50, 3000)
        completion: list[int] = []
        mask: list[int] = []
        while len(completion) < target:
            for keep, median in ((1, 60), (0, 40)):  # an agent reply, then the environment's answer
                k = _lognormal(rng, median, 0.7, 5, 1000)
                completion += tok(k)
                mask += [keep] * k
        samples.append(Sample("agent", ("agent", i // group), float(i % 2), tok(rng.randint(200, 600)),
                              completion[:target], mask[:target], None))
    return samples


def layout_costs(samples: list, batch: int, seed: int) -> dict:
    """Tokens and attention scores each layout computes over the pass's own micro-batches."""
    from spade_cli.training import grpo

    real = padded = pairs_padded = pairs_packed = 0
    for step in grpo.plan_steps(len(samples), batch, 1, 1, 1, seed):
        rows = [samples[i] for i in step[0][0]]
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in rows]
        width = max(len(s.prompt_ids) for s in rows) + max(len(s.completion_ids) for s in rows)
        real += sum(lengths)
        padded += len(rows) * width
        pairs_padded += len(rows) * width ** 2
        pairs_packed += sum(n ** 2 for n in lengths)
    return {"real_tokens": real, "padded_tokens": padded,
            "padding_share": {"padded": round(1 - real / padded, 4), "packed": 0.0},
            "attention_scores_packed_over_padded": round(pairs_packed / pairs_padded, 4)}


def run_pass(model_dir: Path, samples: list, batch: int, packing: str, seed: int) -> dict:
    """Seconds of old log-probs + optimizer pass, the old log-probs and the attention that ran, of
    one `spade update` pass."""
    import torch

    from spade_cli.training import grpo
    from spade_cli.training import trainer as update_train
    from stages import update

    samples = copy.deepcopy(samples)
    adv, _ = grpo.group_advantages(torch.tensor([s.reward for s in samples]), [s.group for s in samples])
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
    cfg = update.UpdateConfig(model=str(model_dir), loss_type="dapo", learning_rate=1e-6, packing=packing,
                              per_device_train_batch_size=batch, max_grad_norm=1.0, weight_audit=False, seed=seed)
    tr = update_train.prepare(cfg, {1.0}, None, str(model_dir))
    cpu = time.process_time()
    out = update_train.train_pass(tr, cfg, samples, lambda _m: None)
    cpu = time.process_time() - cpu
    assert out["metrics"]["packed"] == (packing == "on"), out["metrics"]
    return {"seconds": out["metrics"]["old_logps_seconds"] + out["metrics"]["train_seconds"], "cpu_seconds": cpu,
            "old_logps": [s.old_logps for s in samples], "attention": tr.model.config._attn_implementation}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="checkpoint (default: one built offline, --size)")
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--rows", type=int, default=16, help="rows timed")
    ap.add_argument("--share-rows", type=int, default=1024, help="rows the padding share is counted over (no model)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="rows per micro-batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes of each layout, alternating")
    a = ap.parse_args()
    import torch
    from transformers import AutoConfig

    torch.manual_seed(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model
        if model_dir is None:
            from spade_cli.models import tinymodel

            model_dir = Path(tmp) / a.size
            tinymodel.build(model_dir, size=a.size)
        config = AutoConfig.from_pretrained(model_dir)
        samples = draw_samples(a.rows, config.vocab_size, a.group, a.seed)
        costs = layout_costs(samples, a.batch, a.seed)  # the pass's own plan (same seed)
        many = layout_costs(draw_samples(a.share_rows, config.vocab_size, a.group, a.seed + 1), a.batch, a.seed)
        for layout in ("off", "on"):  # warm-up: first-call costs hit neither side
            run_pass(model_dir, samples[:a.batch], a.batch, layout, a.seed)
        times: dict[str, list[float]] = {"padded": [], "packed": []}
        cpu: dict[str, list[float]] = {"padded": [], "packed": []}
        runs = {}
        for _ in range(a.repeats):  # alternating, so a burst of machine load hits both sides
            for name, layout in (("padded", "off"), ("packed", "on")):
                runs[name] = run_pass(model_dir, samples, a.batch, layout, a.seed)
                times[name].append(round(runs[name]["seconds"], 3))
                cpu[name].append(round(runs[name]["cpu_seconds"], 3))
    diff = max(abs(x - y) for p, q in zip(runs["padded"]["old_logps"], runs["packed"]["old_logps"], strict=True)
               for x, y in zip(p, q, strict=True))
    prompts = [len(s.prompt_ids) for s in samples]
    completions = [len(s.completion_ids) for s in samples]
    padded_s, packed_s = statistics.median(times["padded"]), statistics.median(times["packed"])
    padded_cpu, packed_cpu = statistics.median(cpu["padded"]), statistics.median(cpu["packed"])
    result = {
        "model": str(a.model or f"spade init-model --size {a.size}"),
        "attention": {name: run["attention"] for name, run in runs.items()},
        "rows": a.rows, "batch": a.batch, "torch_threads": torch.get_num_threads(), "machine": platform.machine(),
        "prompt_tokens": {"min": min(prompts), "median": statistics.median(prompts), "max": max(prompts)},
        "completion_tokens": {"min": min(completions), "median": statistics.median(completions),
                              "max": max(completions)},
        **costs, f"over_{a.share_rows}_rows": {k: many[k] for k in ("padding_share",
                                                                   "attention_scores_packed_over_padded")},
        "seconds": times, "cpu_seconds": cpu,
        "tokens_per_s": {"padded": round(costs["real_tokens"] / padded_s, 1),
                         "packed": round(costs["real_tokens"] / packed_s, 1)},
        "packed_over_padded": round(padded_s / packed_s, 3),
        "packed_over_padded_cpu_time": round(padded_cpu / packed_cpu, 3), "old_logp_max_abs_diff": diff,
    }
    share, wide = result["padding_share"]["padded"], many["padding_share"]["padded"]
    print(f"padding share: padded {share:.1%} of the tokens computed ({wide:.1%} over {a.share_rows} rows), "
          "packed 0%", file=sys.stderr)
    print(f"tokens/s: padded {result['tokens_per_s']['padded']}, packed {result['tokens_per_s']['packed']} "
          f"({result['packed_over_padded']}x; {result['packed_over_padded_cpu_time']}x in CPU time); old log-probs "
          f"differ by at most {diff:.2g}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
