"""Scripted players for part of the starter pool, and Agent warm-start samples from their episodes.

A random model warm-started only as a Designer plays every environment as noise: all returns are
0, every GRPO group of the Agent has zero variance, and the Agent never trains. `spade warmstart
--agent-episodes N` fixes that by also imitating these plain Python policies, which read the
observations and reply with an action. With ``noise`` the policy replies at random some of the
time, so the imitated Agent is good but not perfect: partial success is what gives GRPO variance.

The samples are made by the rollout engine itself (``spade_cli.episodes.Engine``) in the real
sandbox, with a scripted backend in place of the model, so prompt, chat template, splicing and the
agent-token mask are exactly what ``spade rollout`` produces; only the replies differ.

Seeds: rollout and eval draw every env seed from a hash truncated to 31 bits (``episode_seed``), so
the warm start plays seeds from ``SEED_BASE = 2**31`` up: no episode the loop or an ``envs:`` eval
ever plays shares a seed with one it was warm-started on.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

SEED_BASE = 2**31  # above every seed `episode_seed` can return (it keeps 31 bits)

USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)

Policy = Callable[[list[str], random.Random, float], str]


def _last_int(pattern: str, texts: list[str], default: int) -> int:
    for text in reversed(texts):
        m = re.search(pattern, text)
        if m:
            return int(m.group(1))
    return default


def exact_sum(obs: list[str], rng: random.Random, noise: float) -> str:
    """Add 9 while at least 9 remain, then the remainder (the env's own hint)."""
    target = _last_int(r"Reach exactly (\d+)", obs[:1], 30)
    total = _last_int(r"Total:? (\d+)", obs, 0)
    if rng.random() < noise:
        return str(rng.randint(1, 9))
    return str(min(9, max(1, target - total)))


def guess_number(obs: list[str], rng: random.Random, noise: float) -> str:
    """Binary search on the higher/lower answers."""
    lo, hi = 1, 100
    for text in obs[1:]:
        m = re.match(r"(\d+) is wrong; go (higher|lower)", text)
        if m:
            g = int(m.group(1))
            lo, hi = (max(lo, g + 1), hi) if m.group(2) == "higher" else (lo, min(hi, g - 1))
    lo, hi = min(lo, hi), max(lo, hi)
    return str(rng.randint(lo, hi) if rng.random() < noise else (lo + hi) // 2)


def price_lookup(obs: list[str], rng: random.Random, noise: float) -> str:
    """Look up every ordered item, then submit the sum of price times quantity."""
    m = re.search(r"Order: (\{.*?\})", obs[0])
    order = dict(re.findall(r'"(\w+)": (\d+)', m.group(1))) if m else {}
    prices = dict(re.findall(r"(\w+) costs (\d+)\.", "\n".join(obs[1:])))
    missing = [k for k in order if k not in prices]
    if missing:
        return json.dumps({"tool": "price", "item": missing[0]})
    total = sum(int(prices[k]) * int(n) for k, n in order.items())
    if rng.random() < noise:
        total += rng.choice([-2, -1, 1, 2])
    return json.dumps({"tool": "submit", "total": total})


SOLVERS: dict[str, Policy] = {"exact_sum": exact_sum, "guess_number": guess_number, "price_lookup": price_lookup}


class ScriptedBackend:
    """A backend whose replies come from a policy over the observations in the prompt.

    The observations are read back from the rendered chat (the user turns after the system
    message), so this works with Qwen3-style templates, the tiny model's included."""

    name = "scripted"
    continuous = False

    def __init__(self, tokenizer: Any, policy: Policy, noise: float, seed: int):
        self.tokenizer, self.policy, self.noise, self.seed = tokenizer, policy, noise, seed
        self.model = "scripted"

    def generate(self, prompts: list[list[int]], n: int, sampling: Any,
                 seeds: list[int] | None = None) -> list[list[Any]]:
        from spade_cli.backends import GenSample

        out = []
        for i, ids in enumerate(prompts):
            obs = USER_TURN.findall(self.tokenizer.decode(ids, skip_special_tokens=False))
            rng = random.Random(f"{self.seed}|{seeds[i] if seeds else i}")
            reply = self.policy(obs, rng, self.noise)
            toks = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([GenSample(token_ids=toks, text=reply, logprobs=None, finish_reason="stop")] * n)
        return out

    def close(self) -> None:
        pass


def play(tokenizer: Any, envs: list[dict], episodes: int, *, noise: float, seed: int, max_turns: int,
         enable_thinking: bool) -> list[Any]:
    """``episodes`` pairs (unhinted and hinted, one seed) of each env that has a solver, played by
    the rollout engine in the sandbox; returns the rollout records."""
    from spade_cli.episodes import Engine, EnvSource, EpisodeSpec, PlayConfig, episode_id
    from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool

    cfg = PlayConfig(max_turns=max_turns, enable_thinking=enable_thinking, temperature=0.0, seed=seed)
    rows: list[Any] = []
    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        for env in envs:
            policy = SOLVERS.get(env["name"])
            if policy is None:
                continue
            env_id = f"warmstart-{env['name']}"
            specs = [EpisodeSpec(episode_id(seed, -1, env_id, p, h), env_id, -1, h, SEED_BASE + seed * episodes + p, p)
                     for p in range(episodes) for h in (False, True)]
            backend = ScriptedBackend(tokenizer, policy, noise, seed)
            engine = Engine(backend, pool, {env_id: EnvSource(env_id, env["code"], env["hint"])}, cfg,
                            rows.append, env_error=EnvError)
            engine.run(specs)
    return rows


def agent_samples(rows: list[Any]) -> list[dict]:
    """SFT samples from rollout records: the agent's tokens carry loss, env and template tokens not."""
    out = []
    for r in rows:
        if r.error:
            continue
        t = r.tokens
        out.append({"input_ids": t["prompt_ids"] + t["completion_ids"],
                    "completion_mask": [0] * len(t["prompt_ids"]) + list(t["env_mask"])})
    return out
