"""Benchmark: `spade update`'s GRPO loop next to TRL's own GRPOTrainer on the same stored samples.

Both sides train the same model on the same samples (groups of ``--group`` completions with
rewards 0/1, an environment segment masked in the middle of each completion) with the same loss
(``dapo``, beta 0, one pass, constant learning rate, micro-batches of ``--batch``). TRL gets the
samples through a replay ``rollout_func`` (no generation), the route in TRL's docs for
externally generated completions. Timed: the optimizer pass only (model loading and trainer
construction excluded on both sides; one untimed warm-up each, then the median of ``--repeats``
alternating runs). spade's time includes recomputing the old log-probs (one no-grad forward,
which TRL's replay route skips); each spade run loads the trainer state the previous one wrote
and writes its own, timed separately. Printed: tokens/s (prompt + completion tokens per second)
of each, their ratio, and the ratio with the state I/O added, measured in the same process so
machine load affects both alike.

    .venv/bin/python recipes/bench_update.py                      # tiny model, built offline
    .venv/bin/python recipes/bench_update.py --model ckpt/small --samples 128 --completion 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_samples(model_dir: Path, n: int, group: int, prompt_len: int, completion_len: int, seed: int) -> list:
    """Random token sequences with sampler log-probs from the model itself (ratio 1 at the start)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spade_cli.training.grpo import Sample

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rng = random.Random(seed)
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    samples = []
    for i in range(n):
        g = i // group
        prompt = [vocab[(g * 7 + j) % len(vocab)] for j in range(prompt_len)]
        completion = [rng.choice(vocab) for _ in range(completion_len)]
        env = range(completion_len // 3, completion_len // 3 + completion_len // 6)
        mask = [0 if j in env else 1 for j in range(completion_len)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, prompt_len - 1:-1]
        lps = logits.float().log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()
        lps = [lp if m else 0.0 for lp, m in zip(lps, mask, strict=True)]
        samples.append(Sample("agent", ("agent", g), float(i % 2), prompt, completion, mask, lps))
    return samples


def bench_spade(model_dir: Path, samples: list, batch: int, state_dir: Path) -> tuple[float, float]:
    """(seconds of the update's work: old log-probs + optimizer pass, seconds of state I/O: loading
    the previous run's trainer state and writing this one's), as every chained `spade update` does."""
    import copy

    import torch

    from spade_cli.training import grpo
    from spade_cli.training import trainer as update_train
    from stages import update

    samples = copy.deepcopy(samples)
    adv, _ = grpo.group_advantages(torch.tensor([s.reward for s in samples]), [s.group for s in samples])
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
    cfg = update.UpdateConfig(model=str(model_dir), loss_type="dapo", learning_rate=1e-6,
                              per_device_train_batch_size=batch, max_grad_norm=1.0, weight_audit=False)
    state = {"path": str(state_dir)} if (state_dir / "model.safetensors").exists() else None
    tr = update_train.prepare(cfg, {1.0}, state, str(model_dir))
    out = update_train.train_pass(tr, cfg, samples, lambda _m: None)
    assert out["metrics"]["optimizer_steps"] == len(samples) // batch, out["metrics"]
    t0 = time.perf_counter()
    tr.accelerator.save_state(str(state_dir))
    io = time.perf_counter() - t0 + tr.timings.get("state_load_s", 0.0)
    return out["metrics"]["old_logps_seconds"] + out["metrics"]["train_seconds"], io


def bench_trl(model_dir: Path, samples: list, batch: int, group: int) -> float:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    by_group: dict[str, list] = {}
    for s in samples:
        by_group.setdefault(f"group {s.group[1]}", []).append(s)
    cursor = {k: 0 for k in by_group}

    def replay(prompts: list, trainer: object) -> dict:
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "stored_reward": []}
        for p in prompts:
            s = by_group[p][cursor[p] % group]
            cursor[p] += 1
            out["prompt_ids"].append(s.prompt_ids)
            out["completion_ids"].append(s.completion_ids)
            out["logprobs"].append(s.sampler_logps)
            out["env_mask"].append(s.mask)
            out["stored_reward"].append(s.reward)
        return out

    def stored_reward(completions: list, stored_reward: list, **_: object) -> list:
        return stored_reward

    tok = AutoTokenizer.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=batch, num_generations=group,
            max_completion_length=max(len(s.completion_ids) for s in samples), max_steps=len(samples) // batch,
            learning_rate=1e-6, lr_scheduler_type="constant", logging_steps=10_000, bf16=False,
            gradient_checkpointing=False, report_to="none", save_strategy="no", use_cpu=True, beta=0.0,
            loss_type="dapo", scale_rewards="group", seed=0, shuffle_dataset=False, disable_tqdm=True)
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=stored_reward, args=args,
                              train_dataset=Dataset.from_list([{"prompt": k} for k in by_group]),
                              processing_class=tok, rollout_func=replay)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    # Both sides must have trained on every sample exactly once.
    assert trainer.state.global_step == len(samples) // batch, trainer.state.global_step
    assert sum(cursor.values()) == len(samples), cursor
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="checkpoint (default: a tiny one built offline)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--completion", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side, alternating")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model
        if model_dir is None:
            from spade_cli.models import tinymodel

            model_dir = Path(tmp) / "tiny"
            tinymodel.build(model_dir, size="tiny")
        samples = make_samples(model_dir, a.samples, a.group, a.prompt, a.completion, a.seed)
        tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        state_dir = Path(tmp) / "trainer_state"  # each spade run resumes the previous one's state
        bench_spade(model_dir, samples[:a.batch], a.batch, state_dir)  # warm-up: first-call costs hit neither side
        bench_trl(model_dir, samples[:a.batch], a.batch, a.group)
        times: dict[str, list[float]] = {"spade": [], "trl": [], "state_io": []}
        for _ in range(a.repeats):  # alternating, so a burst of machine load hits both sides
            spade_s, io_s = bench_spade(model_dir, samples, a.batch, state_dir)
            times["spade"].append(spade_s)
            times["state_io"].append(io_s)
            times["trl"].append(bench_trl(model_dir, samples, a.batch, a.group))
        spade_s, trl_s, io_s = (statistics.median(times[k]) for k in ("spade", "trl", "state_io"))
    result = {"samples": a.samples, "tokens": tokens, "seconds": times, "spade_tokens_per_s": round(tokens / spade_s, 1),
              "trl_tokens_per_s": round(tokens / trl_s, 1), "spade_over_trl": round(trl_s / spade_s, 3),
              "state_io_s": round(io_s, 3), "spade_with_state_io_over_trl": round(trl_s / (spade_s + io_s), 3)}
    print(f"spade update: {result['spade_tokens_per_s']:>10} tokens/s (old log-probs + optimizer pass)",
          file=sys.stderr)
    print(f"TRL GRPOTrainer (replay): {result['trl_tokens_per_s']:>10} tokens/s", file=sys.stderr)
    print(f"ratio spade / TRL: {result['spade_over_trl']}x (target: >= 1); with the trainer state loaded and "
          f"written ({result['state_io_s']} s): {result['spade_with_state_io_over_trl']}x", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
