"""The prepared parts of recipes/gpu_check.sh: a random Qwen3-shaped model, fixture episodes, the summary.

    python recipes/gpu_check.py build WORK --shape gpu      # ~0.3B parameters, built on the device
    python recipes/gpu_check.py episodes WORK --n 64 --prompt 256 --completion 1024
    python recipes/gpu_check.py summary WORK ck1 ck2        # one JSON line from the updates' reports

Nothing here reaches a network: the tokenizer is spade's offline tiny one (``spade init-model``),
the weights are random, the episodes are random tokens with alternating returns.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {  # head_dim 128 as in Qwen3-4B/8B; "dry" is for the CPU path of the tests
    "gpu": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=24, num_attention_heads=8,
                num_key_value_heads=4, head_dim=128),
    "dry": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32),
}


def build(work: Path, shape: str, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from spade_cli.models import tinymodel

    tinymodel.build(work / "tokenizer", size="tiny", seed=seed)  # offline tokenizer and chat template
    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    cfg = Qwen3Config(vocab_size=len(tok), max_position_embeddings=32768, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **SHAPES[shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    with torch.device(device):  # the weights are drawn on the device: no host copy of the model
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    return {"params": sum(p.numel() for p in model.parameters()), "device": device, "shape": shape}


def episodes(work: Path, n: int, prompt: int, completion: int, group: int, seed: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "model")
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        env = i // (2 * group)  # groups: (env, unhinted) with returns 0/1 alternating
        c = [rng.choice(vocab) for _ in range(completion)]
        masked = range(completion // 3, completion // 3 + completion // 8)  # an environment reply
        rows.append({"schema": "spade.rollout/1", "episode_id": f"e{i}", "env_id": f"env{env:03d}", "iteration": 0,
                     "hinted": False, "seed": i, "pair": i, "messages": [], "turns": [], "return": float(i % 2),
                     "terminated": True, "truncated": False, "error": None,
                     "tokens": {"prompt_ids": [vocab[(env * 7 + j) % len(vocab)] for j in range(prompt)],
                                "completion_ids": c, "env_mask": [0 if j in masked else 1 for j in range(completion)],
                                "logprobs": None}})
    (work / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"episodes": n, "tokens": n * (prompt + completion)}


def summary(work: Path, ckpts: list[str], extra: dict) -> dict:
    reports = [json.loads((work / c / "update.json").read_text()) for c in ckpts]
    out: dict = {"check": "gpu_check", **extra, "updates": []}
    for c, r in zip(ckpts, reports, strict=True):
        met, mem, st = r["metrics"], r.get("host_memory") or {}, r["trainer_state"]
        procs = mem.get("per_process", [])
        out["updates"].append({
            "ckpt": c, "resumed": st["resumed"] is not None, "processes": met["processes"],
            "tokens_per_s": met["tokens_per_s"], "optimizer_steps": met["optimizer_steps"],
            "s_per_step": round(met["train_seconds"] / max(met["optimizer_steps"], 1), 3),
            "state_save_s": st.get("save_s"), "state_load_s": st.get("state_load_s"), "state_bytes": st.get("bytes"),
            "host_peak_mb": max((p["peak_mb"] for p in procs), default=None),
            "host_added_mb": mem.get("added_mb"),
            "gpu_peak_mb": max((p.get("gpu_peak_mb", 0) for p in procs), default=None)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("work", type=Path)
    b.add_argument("--shape", choices=sorted(SHAPES), default="gpu")
    b.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("episodes")
    e.add_argument("work", type=Path)
    e.add_argument("--n", type=int, default=64)
    e.add_argument("--prompt", type=int, default=256)
    e.add_argument("--completion", type=int, default=1024)
    e.add_argument("--group", type=int, default=4)
    e.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("summary")
    s.add_argument("work", type=Path)
    s.add_argument("ckpts", nargs="+")
    s.add_argument("--extra", default="{}", help="JSON merged into the line (the build, the generation hook)")
    a = ap.parse_args()
    if a.cmd == "build":
        res = build(a.work, a.shape, a.seed)
    elif a.cmd == "episodes":
        res = episodes(a.work, a.n, a.prompt, a.completion, a.group, a.seed)
    else:
        res = summary(a.work, a.ckpts, json.loads(a.extra))
    print(json.dumps(res, separators=(",", ":")))


if __name__ == "__main__":
    main()
