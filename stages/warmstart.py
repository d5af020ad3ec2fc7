"""`spade warmstart`: a short supervised fine-tune that teaches a model the Designer's output format.

A randomly initialised model (``spade init-model``) writes noise, so every design would fail to
parse and the loop would have nothing to play. The paper starts from Qwen3 models that already
write Python; on a laptop we start from a 13M-parameter random model and warm-start it on the
bundled example pool instead: each training sample is a real Designer prompt, built exactly as
``spade design`` builds it (same contract, same corpus sampling, same chat template and
``enable_thinking`` setting), and the target is one pool environment in the required answer format.
Every epoch pairs the environments with different documents, and every other epoch adds a practice
memory summary (pool titles and hints with made-up learner statistics), so the model learns to
write an environment whatever the document and the memory say — which is all a warm start has to
do; the loop does the rest. From iteration 1 on, the real prompts carry a memory summary: a model
warm-started without one falls apart on them.

TRL's ``SFTTrainer`` does the training on a pre-tokenized dataset (``input_ids`` plus a
``completion_mask``), so only the answer tokens carry loss and the prompt tokens are identical to
what the Designer sees at design time.

    spade warmstart --model ckpt/small --out ckpt/warm --pool bundled --epochs 12 --max-examples 6
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any


def practice_memory(envs: list[dict], seed: int, epoch: int, path: Path) -> Path:
    """A made-up environment memory (pool titles and hints with random learner statistics), so the
    warm-started model has seen prompts with a memory summary before the loop shows it real ones."""
    import random

    from spade_cli.core.artifacts import write_jsonl
    from spade_cli.core.records import Memory

    rng = random.Random(f"{seed}|{epoch}")
    rows = []
    for i, env in enumerate(rng.sample(envs, k=rng.randint(1, len(envs)))):
        unhinted, hinted = sorted(round(rng.random(), 2) for _ in range(2))
        rows.append(Memory(env_id=f"practice{i}", title=env["title"], hint=env["hint"], first_iteration=0,
                           history=[{"iteration": rng.randint(0, 9), "unhinted_mean": unhinted,
                                     "hinted_mean": hinted, "regret": round(hinted - unhinted, 2)}]))
    write_jsonl(path, rows)
    return path


def build_samples(tokenizer: Any, envs: list[dict], epochs: int, seed: int, corpus: str | None,
                  grounding: bool, excerpt_chars: int, example: bool, enable_thinking: bool,
                  memory_pool: list[dict] | None = None, contract: str = "full",
                  memory_k: int = 12) -> list[dict]:
    """One pre-tokenized sample per (epoch, environment), each with its own Designer prompt.

    Every other epoch the prompts carry a practice memory summary built from ``memory_pool``."""
    import tempfile

    from spade_cli.backends import render_chat
    from spade_cli.designer import prompts
    from spade_cli.designer.plan import plan_prompts
    from spade_cli.envs.pool import worked_example

    eos = tokenizer.eos_token_id
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        for epoch in range(epochs):
            memory = None
            if memory_pool and epoch % 2:
                memory = practice_memory(memory_pool, seed, epoch, Path(tmp) / f"memory{epoch}.jsonl")
            # One prompt per epoch for every environment: given any prompt the model must keep all
            # environments equally likely, or sampling collapses onto one (and validate then flags
            # the copies as duplicates).
            [p] = plan_prompts(n=1, group=1, seed=seed, iteration=epoch, corpus=corpus,
                               grounding=grounding, memory=memory, excerpt_chars=excerpt_chars,
                               worked=worked_example() if example else None, contract=contract,
                               memory_k=memory_k)
            prompt_ids = render_chat(tokenizer, p["messages"], enable_thinking=enable_thinking)
            for env in envs:
                answer = (_spec_answer(env["spec"], seed, epoch) if contract == "spec"
                          else prompts.format_answer(env["title"], env["code"], env["hint"]))
                completion_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos]
                samples.append({"input_ids": prompt_ids + completion_ids,
                                "completion_mask": [0] * len(prompt_ids) + [1] * len(completion_ids)})
    return samples


def _spec_answer(spec: dict, seed: int, epoch: int) -> str:
    """A design-space target: the env's cell with rounds and feedback drawn per epoch, so the
    Designer learns every knob's range, not one setting."""
    import random

    from spade_cli.designer import space

    rng = random.Random(f"{seed}|{epoch}|{spec['rule']}|{spec['level']}")
    return space.format_spec(space.Spec(spec["rule"], spec["level"], rng.randint(1, space.MAX_ROUNDS),
                                        rng.choice(space.FEEDBACK)))


def load_envs(pool: str) -> list[dict]:
    """The pool's environments, shortest first (cheaper to learn when only some are used)."""
    from spade_cli.envs import pool as pool_mod

    envs = pool_mod.load_envs(pool)
    return sorted(envs, key=lambda e: (len(e["code"]) + len(e["hint"]), e.get("name", e["title"])))


def pick_envs(pool: str, max_examples: int | None) -> list[dict]:
    envs = load_envs(pool)
    return envs[:max_examples] if max_examples else envs


def run(out: str | Path, *, model: str, pool: str = "bundled", epochs: int = 12, learning_rate: float = 2e-3,
        batch_size: int = 2, max_examples: int | None = None, seed: int = 0, corpus: str | None = None,
        grounding: bool = True, excerpt_chars: int = 300, example: bool = False,
        enable_thinking: bool = False, agent_episodes: int = 0, agent_noise: float = 0.0,
        agent_max_turns: int = 16, agent_thinking: bool = True, contract: str = "full",
        agent_pool: str | None = None, memory_k: int = 12, config: dict | None = None,
        force: bool = False) -> dict:
    """Fine-tune ``model`` on the pool and write the checkpoint to ``out`` (a directory).

    With ``agent_episodes`` the Agent is warm-started too: that many seeds of every pool env that
    has a scripted solver (``spade_cli.envs.solvers``), played hinted and unhinted by the rollout engine
    with ``agent_max_turns`` and ``agent_thinking`` (use the loop's ``--max-turns`` and
    ``--thinking``, so the prompts are the ones rollout renders). ``agent_pool`` (default: ``pool``)
    is where those envs come from, so the Designer and the Agent can learn from different pools.
    ``contract`` is the Designer prompt's system message (``spade design --contract``)."""
    from spade_cli.core.artifacts import SpadeError, Stage, later_defaults_dropped
    from spade_cli.core.errors import check_rows

    envs = pick_envs(pool, max_examples)
    if not envs:
        raise SpadeError(f"the pool {pool!r} has no environments")
    if contract == "spec" and epochs and not all("spec" in e for e in envs):
        raise SpadeError(f"--contract spec trains the Designer on specs: use a design-space pool "
                         f"(--pool space), not {pool!r}")
    if epochs == 0 and agent_episodes == 0:
        raise SpadeError("nothing to train: epochs (Designer) and agent_episodes (Agent) are both 0")
    # The Agent's pool is read here too, before any model loads: a bad pool file is refused at once.
    agent_envs = load_envs(agent_pool or pool) if agent_episodes else []
    check_rows(epochs * len(envs) + agent_episodes * len(agent_envs),
               f"--epochs {epochs} over {len(envs)} env(s) and --solver-seeds {agent_episodes} over {len(agent_envs)}",
               "samples", "lower them")
    # resolved_config already left the later-added options at their defaults out of a CLI config
    config = config or later_defaults_dropped({
        "model": model, "pool": pool, "epochs": epochs, "learning_rate": learning_rate,
        "batch_size": batch_size, "max_examples": max_examples, "seed": seed, "corpus": corpus,
        "grounding": grounding, "excerpt_chars": excerpt_chars, "example": example,
        # keyed by the command's option names, as the manifest of `spade warmstart` records them
        "thinking": enable_thinking, "solver_seeds": agent_episodes, "agent_noise": agent_noise,
        "agent_max_turns": agent_max_turns, "agent_think": agent_thinking, "contract": contract,
        "agent_pool": agent_pool, "memory_k": memory_k}, "warmstart")
    from spade_cli.envs import pool as pool_mod

    inputs = {"model": [model]} if Path(model).exists() else {}
    # the pools are inputs too: a changed env (or family generator) makes the warm start stale
    inputs["pool"] = sorted({str(pool_mod.pool_path(p)) for p in (pool, agent_pool) if p})
    stage = Stage.begin("warmstart", out, config, inputs, force=force, out_kind="dir")
    if stage.check():
        return {"status": "up to date", "out": str(out)}

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class _StderrLog(TrainerCallback):
        def __init__(self, every: int):
            self.every = every

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "loss" in logs and (state.global_step % self.every == 0 or state.global_step == 1):
                print(f"warmstart step {state.global_step}/{state.max_steps}: loss {float(logs['loss']):.4f}",
                      file=sys.stderr, flush=True)

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model)
    samples = build_samples(tokenizer, envs, epochs, seed, corpus, grounding, excerpt_chars, example,
                            enable_thinking, memory_pool=load_envs(pool), contract=contract,
                            memory_k=memory_k)
    n_designer, agent = len(samples), {}
    if agent_episodes:
        from spade_cli.envs import solvers

        rows = solvers.play(tokenizer, agent_envs, agent_episodes, noise=agent_noise, seed=seed,
                            max_turns=agent_max_turns, enable_thinking=agent_thinking)
        if not rows:
            raise SpadeError(f"the pool {agent_pool or pool!r} has no environment with a scripted solver "
                             f"({', '.join(solvers.SOLVERS)})")
        samples += solvers.agent_samples(rows)
        agent = {"agent_samples": len(samples) - n_designer,
                 "agent_solver_return": round(sum(r.return_ for r in rows) / len(rows), 3),
                 "agent_envs": sorted({r.env_id for r in rows})}
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    args = SFTConfig(
        output_dir=str(tmp / "trainer"), num_train_epochs=1, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, lr_scheduler_type="cosine", warmup_steps=max(1, len(samples) // 20),
        completion_only_loss=True, max_length=max(len(s["input_ids"]) for s in samples), logging_steps=1,
        save_strategy="no", report_to="none", seed=seed, use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True,
        # TRL turns activation checkpointing on by default: it saves GPU memory, and on a CPU it only
        # recomputes every forward (64 s against 53 s on 80 starter samples of the small model)
        gradient_checkpointing=torch.cuda.is_available(),
    )
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    trainer = SFTTrainer(model=lm, args=args, train_dataset=Dataset.from_list(samples),
                         processing_class=tokenizer)
    # transformers prints its logs on stdout, which belongs to the JSON summary line: log to stderr.
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_StderrLog(every=max(1, len(samples) // batch_size // 10)))
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trainer.model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(tmp / "trainer", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    summary = {"status": "ok", "out": str(out), "envs": [e.get("name", e["title"]) for e in envs],
               "samples": len(samples),
               "designer_samples": n_designer, **agent,
               "tokens": sum(len(s["input_ids"]) for s in samples), "steps": result.global_step,
               "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
               "train_seconds": round(result.metrics.get("train_runtime", 0.0), 1)}
    stage.write_manifest(None, summary)
    return summary
