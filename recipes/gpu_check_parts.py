"""The parts of the GPU check (recipes/gpu_check.py), one function each; each returns the JSON
object its part prints as its last stdout line.

    python recipes/gpu_check.py install WORK --wheels gpu_wheels   # pip --no-index into WORK/site
    python recipes/gpu_check.py build WORK --shape gpu --vocab 151936 --n 32 --prompt 1024 --completion 5120
    python recipes/gpu_check.py update WORK ck1 --from model --batch 4 --bf16     # one `spade update`
    python recipes/gpu_check.py update WORK ckz --from model --zero2 --like ck1     # the same under ZeRO-2
    python recipes/gpu_check.py resume WORK --first ck1 --chained ck2               # one process, two passes
    python recipes/gpu_check.py generate WORK --from ck2                            # the hf backend
    python recipes/gpu_check.py vllm WORK                                           # the vllm backend, spade serve
    python recipes/gpu_check.py smoke WORK                                          # tiny bf16 and LoRA updates

Nothing here reaches a network: the tokenizer is spade's offline tiny one (``spade init-model``),
the weights are random, the episodes are random tokens with alternating returns. The model is
Qwen3-0.6B's shape with its embeddings untied, so the LM head holds its own 151,936 x 1024 matrix
as larger Qwen3 models do.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPES = {  # "gpu": Qwen3-0.6B's layers (head_dim 128 as in Qwen3-4B/8B); "dry": the tests' CPU path
    "gpu": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128),
    "dry": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32),
}
# what the update, the trainer and the hf backend import: the check of an install
IMPORTS = ("spade_cli.app", "spade_cli.training.trainer", "msgspec", "trl.trainer.utils", "datasets", "deepspeed")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true")


def install(work: Path, wheels: Path | None) -> dict:
    """Install every wheel of ``wheels`` into WORK/site without network or dependency resolution
    (the image keeps its own torch and the rest); report versions, unmet requirements, imports."""
    site = work / "site"
    out: dict = {}
    if wheels is None:
        out.update(status="skipped", why="no WHEELS folder given: the environment is used as it is")
    else:
        files = sorted(str(p) for p in wheels.glob("*.whl"))
        if not files:
            raise SystemExit(f"{wheels}: no wheels in this folder (python recipes/gpu_check.py wheels gathers them)")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                        "--no-deps", "--no-compile", "--disable-pip-version-check", "--target", str(site),
                        *files], check=True, stdout=sys.stderr)
        out.update(wheels=len(files), bytes=sum(Path(f).stat().st_size for f in files),
                   install_s=round(time.perf_counter() - t0, 1), unmet=_unmet(site))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    out["versions"] = _versions(env)
    if wheels is None:
        return out
    probe = ("import importlib, json, sys\nres = {}\nfor m in sys.argv[1:]:\n    try:\n"
             "        importlib.import_module(m); res[m] = 'ok'\n    except Exception as e:\n"
             "        res[m] = f'{type(e).__name__}: {e}'[:300]\nprint(json.dumps(res))")
    res = subprocess.run([sys.executable, "-c", probe, *IMPORTS], env=env, capture_output=True, text=True)
    out["imports"] = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else res.stderr[-500:]
    if (site / "deepspeed").is_dir() and isinstance(out["imports"], dict) and out["imports"]["deepspeed"] != "ok":
        # accelerate and transformers import deepspeed whenever its package is found: a broken one
        # would fail every part. Only the ZeRO-2 part needs it, and it says why it skips.
        for p in [site / "deepspeed", *site.glob("deepspeed-*.dist-info")]:
            shutil.rmtree(p, ignore_errors=True)
        out["deepspeed_removed"] = out["imports"]["deepspeed"]
        (work / "deepspeed_removed.txt").write_text(out["deepspeed_removed"] + "\n")
    broken = [m for m, v in out["imports"].items() if v != "ok" and m != "deepspeed"] \
        if isinstance(out["imports"], dict) else ["the import check"]
    if broken:
        raise SystemExit(f"installed, but these do not import: {', '.join(broken)}: {json.dumps(out)}")
    return out


def _versions(env: dict) -> dict:
    code = ("import json; from importlib.metadata import version as v\nout = {}\n"
            "for n in ('torch', 'transformers', 'accelerate', 'trl', 'deepspeed', 'datasets', 'spade'):\n"
            "    try: out[n] = v(n)\n    except Exception: out[n] = None\nprint(json.dumps(out))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _unmet(site: Path) -> list[str]:
    """Requirements of the installed wheels that neither the folder nor the image satisfies."""
    from importlib.metadata import PackageNotFoundError, distribution, distributions

    from packaging.requirements import Requirement

    sys.path.insert(0, str(site))
    unmet = []
    for dist in distributions(path=[str(site)]):
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = distribution(req.name).version
            except PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist.metadata['Name']} needs {req} (have {have or 'none'})")
    return sorted(set(unmet))


def build(work: Path, shape: str, vocab: int, n: int, prompt: int, completion: int, group: int, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from spade_cli.models import tinymodel

    t0 = time.perf_counter()
    tinymodel.build(work / "tokenizer", size="tiny", seed=seed)  # offline tokenizer and chat template
    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    if vocab < len(tok):
        raise SystemExit(f"--vocab {vocab} is below the tokenizer's {len(tok)} tokens")
    cfg = Qwen3Config(vocab_size=vocab, max_position_embeddings=32768, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **SHAPES[shape])
    device = "cuda" if _cuda() else "cpu"
    torch.manual_seed(seed)
    with torch.device(device):  # the weights are drawn on the device: no host copy of the model
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    _episodes(work, tok, n, prompt, completion, group, seed)
    return {"params": sum(p.numel() for p in model.parameters()), "vocab": vocab, "tied": False,
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "shape": shape, "episodes": n, "row_tokens": prompt + completion, "build_s": round(time.perf_counter() - t0, 1)}


def _episodes(work: Path, tok, n: int, prompt: int, completion: int, group: int, seed: int) -> None:
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        env = i // (2 * group)  # groups: (env, unhinted) with returns 0/1 alternating
        masked = range(completion // 3, completion // 3 + completion // 8)  # an environment reply
        rows.append({"schema": "spade.rollout/1", "episode_id": f"e{i}", "env_id": f"env{env:03d}", "iteration": 0,
                     "hinted": False, "seed": i, "pair": i, "messages": [], "turns": [], "return": float(i % 2),
                     "terminated": True, "truncated": False, "error": None,
                     "tokens": {"prompt_ids": [vocab[(env * 7 + j) % len(vocab)] for j in range(prompt)],
                                "completion_ids": [rng.choice(vocab) for _ in range(completion)],
                                "env_mask": [0 if j in masked else 1 for j in range(completion)],
                                "logprobs": None}})
    (work / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def update(work: Path, name: str, start: str, batch: int, bf16: bool, zero2: bool, like: str | None) -> dict:
    """One `spade update` under `accelerate launch` in one process (plain, or ZeRO-2 through
    accelerate's DeepSpeed plugin); its figures from update.json."""
    if zero2:
        removed = work / "deepspeed_removed.txt"
        if removed.exists():
            return {"status": "skipped", "why": "the install part removed deepspeed, which did not import here: "
                                                + removed.read_text().strip()}
        try:
            import deepspeed
        except Exception as e:  # noqa: BLE001  (a broken install is a reason, not a crash)
            return {"status": "skipped", "why": f"deepspeed does not import: {type(e).__name__}: {e}"[:300]}
        if not _cuda():
            return {"status": "skipped", "deepspeed": deepspeed.__version__,
                    "why": "no CUDA device: this check runs ZeRO-2 on a GPU only (deepspeed imports)"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--num_processes", "1",
              "--dynamo_backend", "no"]
    if zero2:
        launch += ["--config_file", str(REPO / "recipes" / "accelerate" / "zero2.yaml")]
    elif _cuda():
        launch += ["--mixed_precision", "bf16" if bf16 else "no"]
    else:
        launch += ["--cpu", "--mixed_precision", "no"]
    flags = ["--bf16", "--gradient-checkpointing"] if bf16 else []
    subprocess.run([*launch, "-m", "spade_cli", "update", "--model", str(work / start), "--rollouts",
                    str(work / "rollouts.jsonl"), "--out", str(work / name), "--learning-rate", "1e-6",
                    "--per-device-train-batch-size", str(batch), *flags], check=True, stdout=sys.stderr)
    out = _report(work / name)
    if like is not None:  # the same samples and seed without DeepSpeed: entropy and norms agree
        ref = _report(work / like)  # (the GRPO loss sits near 0, where a relative difference says nothing)
        out["vs_" + like] = {k: round(abs(out[k] - ref[k]) / max(abs(ref[k]), 1e-12), 6)
                             for k in ("entropy", "grad_norm")}
    return out


def _report(ckpt: Path) -> dict:
    r = json.loads((ckpt / "update.json").read_text())
    met, mem, st = r["metrics"], r.get("host_memory") or {}, r["trainer_state"]
    procs = mem.get("per_process", [])
    return {"resumed": st["resumed"] is not None, "processes": met["processes"], "tokens_per_s": met["tokens_per_s"],
            "optimizer_steps": met["optimizer_steps"], "train_s": met["train_seconds"],
            "s_per_step": round(met["train_seconds"] / max(met["optimizer_steps"], 1), 3),
            "old_logps_s": met["old_logps_seconds"], "loss": met["loss"], "entropy": met["entropy"],
            "grad_norm": met["grad_norm"]["mean"],
            "state_save_s": st.get("save_s"), "state_load_s": st.get("state_load_s"), "state_bytes": st.get("bytes"),
            "host_peak_mb": max((p["peak_mb"] for p in procs), default=None),
            "gpu_peak_mb": max((p.get("gpu_peak_mb", 0) for p in procs), default=None)}


def resume(work: Path, first: str, chained: str) -> dict:
    """The two chained updates (the second resumed the first's trainer state) against one process
    taking the same two passes: the fp32 masters agree. On CPU the match is near bitwise; on a GPU
    non-deterministic kernels (attention's backward) leave a small relative difference."""
    from safetensors.torch import load_file

    from spade_cli.training import trainer as update_train
    from stages import update as stage

    cfg = stage.UpdateConfig(**json.loads((work / first / "update.json").read_text())["config"])
    samples, _ = stage.collect_samples(cfg)
    t0 = time.perf_counter()
    tr = update_train.prepare(cfg, {s.temperature for s in samples}, None, str(Path(cfg.model).resolve()))
    for _ in range(2):
        update_train.train_pass(tr, cfg, samples, lambda _m: None)
    seconds = time.perf_counter() - t0
    one = {k: v.detach().float().cpu() for k, v in tr.model.state_dict().items()}
    chain = load_file(str(work / chained / "trainer_state" / "model.safetensors"))
    start = load_file(str(Path(cfg.model) / "model.safetensors"))
    moved = math.sqrt(sum(float((one[k] - start[k].float()).pow(2).sum()) for k in chain))
    diff = math.sqrt(sum(float((one[k] - chain[k]).pow(2).sum()) for k in chain))
    cuda = next(iter(tr.model.parameters())).is_cuda
    tol = 0.05 if cuda else 1e-3
    out = {"moved_l2": moved, "diff_l2": diff, "relative": diff / moved if moved else None, "tolerance": tol,
           "two_passes_s": round(seconds, 1), "optimizer_steps": tr.counters["optimizer_steps"]}
    if not moved or diff > tol * moved:
        raise SystemExit(f"chained updates differ from one process: {json.dumps(out)}")
    return out


def generate(work: Path, start: str, prompts: int, n: int, max_tokens: int) -> dict:
    import torch

    from spade_cli.backends import Sampling, load_backend, render_chat

    cuda = _cuda()
    backend = load_backend("hf", str(work / start), dtype="bfloat16" if cuda else "float32",
                           device="cuda" if cuda else "cpu")
    chats = [render_chat(backend.tokenizer, [{"role": "user", "content": f"Describe room {i} and its doors."}])
             for i in range(prompts)]
    t0 = time.perf_counter()
    out = backend.generate(chats, n=n, sampling=Sampling(temperature=1.0, max_tokens=max_tokens, seed=0))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    samples = [s for g in out for s in g]
    bad = [s for s in samples if len(s.logprobs) != len(s.token_ids) or not all(map(math.isfinite, s.logprobs))]
    if len(samples) != prompts * n or bad:
        raise SystemExit(f"{len(samples)} samples for {prompts} x {n}, {len(bad)} with bad log-probs")
    tokens = sum(len(s.token_ids) for s in samples)
    return {"device": backend.device, "rows": len(samples), "tokens": tokens, "generate_s": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1), "calls": backend.calls,
            "gpu_peak_mb": round(torch.cuda.max_memory_allocated() / 1e6, 1) if cuda else None}


def _spade(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "spade_cli", *args], check=True, stdout=sys.stderr, env=env)


def vllm(work: Path) -> dict:
    """The vllm backend with engine options on every visible GPU (docs/backends.md), then the real
    engine tier: processed log-probs, seeds, and `spade serve` loading a new checkpoint in place.
    Skipped, not failed, where CUDA or vLLM is missing: the check runs everywhere."""
    try:
        import torch
        import vllm as engine
    except Exception:  # noqa: BLE001  (no vllm, or one that does not import: both are a skip)
        torch = None
    if torch is None or not torch.cuda.is_available():
        return {"status": "skipped", "why": "no CUDA device or no vllm"}
    gpus = torch.cuda.device_count()
    print(f"vllm: {gpus} GPU(s), work dir {work}, vllm {engine.__version__}", file=sys.stderr)
    _spade("init-model", "--out", str(work / "tiny"), "--size", "tiny")
    t0 = time.perf_counter()
    designs = work / "designs.jsonl"
    _spade("design", "--model", str(work / "tiny"), "--backend", "vllm", "--n", "8", "--group", "2",
           "--max-tokens", "64", "--gpu-memory-utilization", "0.3", "--max-model-len", "1024", "--enforce-eager",
           "--engine-arg", "max_num_seqs=64", "--out", str(designs))
    design_s = time.perf_counter() - t0
    eng = json.loads(Path(f"{designs}.manifest.json").read_text())["engine"]
    rows = [json.loads(x) for x in designs.read_text().splitlines()]
    # the default layout is one engine per GPU; the engine options reach the engine
    assert eng["data_parallel_size"] == gpus, eng
    assert eng["gpu_memory_utilization"] == 0.3 and eng["max_num_seqs"] == 64, eng
    assert all(r["gen"]["logprobs"] == "processed" and len(r["tokens"]["logprobs"]) == len(r["tokens"]["completion_ids"])
               for r in rows)
    tokens = sum(len(r["tokens"]["completion_ids"]) for r in rows)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "vllm_cpu", "-q", "-s",
                    "tests/test_backend_vllm.py", "tests/test_serve_vllm_cpu.py"], check=True, cwd=REPO,
                   stdout=sys.stderr)
    return {"status": "ok", "gpus": gpus, "vllm": engine.__version__, "design_s": round(design_s, 1),
            "design_tokens": tokens, "design_tokens_per_s": round(tokens / max(design_s, 1e-9), 1),
            "engine_tier_s": round(time.perf_counter() - t0, 1)}


def smoke(work: Path) -> dict:
    """The quick one: a bf16 update with gradient checkpointing and KL, and a LoRA update, of the tiny
    model on CUDA from the fixture artifacts of tests/test_update.py; both checkpoints load back and
    generate. Skipped where no CUDA device is visible."""
    import torch

    if not torch.cuda.is_available():
        return {"status": "skipped", "why": "no CUDA device visible"}
    from transformers import AutoModelForCausalLM

    from tests.test_update import make_artifacts

    _spade("init-model", "--out", str(work / "tiny"), "--size", "tiny")
    make_artifacts(work, work / "tiny")
    common = ["--model", str(work / "tiny"), "--rollouts", str(work / "rollouts.jsonl"), "--envs",
              str(work / "validated.jsonl"), "--scores", str(work / "scores.jsonl"), "--learning-rate", "1e-4",
              "--per-device-train-batch-size", "4", "--bf16"]
    _spade("update", *common, "--out", str(work / "ckpt_full"), "--gradient-checkpointing", "--beta", "0.04")
    _spade("update", *common, "--out", str(work / "ckpt_lora"), "--lora", "--lora-r", "8")
    out: dict = {"device": torch.cuda.get_device_name(0)}
    for name in ("ckpt_full", "ckpt_lora"):
        m = json.loads((work / name / "update.json").read_text())["metrics"]
        model = AutoModelForCausalLM.from_pretrained(work / name, dtype=torch.bfloat16).cuda()
        gen = model.generate(torch.tensor([[1, 2, 3]], device="cuda"), max_new_tokens=4, do_sample=False)
        if not (m["grad_norm"]["max"] > 0 and gen.shape[1] == 7):
            raise SystemExit(f"{name}: no gradient or no generation: {json.dumps(m)}")
        out[name] = {"loss": m["loss"], "grad_norm": m["grad_norm"]["max"], "tokens_per_s": m["tokens_per_s"]}
    return out
