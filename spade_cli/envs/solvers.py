"""Scripted players for part of the starter pool, and Agent warm-start samples from their episodes.

A random model warm-started only as a Designer plays every environment as noise: all returns are
0, every GRPO group of the Agent has zero variance, and the Agent never trains. `spade warmstart
--agent-episodes N` fixes that by also imitating these plain Python policies, which read the
observations and reply with an action. The model imitates them imperfectly, and that partial
success is what gives GRPO variance. ``noise`` makes the policy reply at random some of the time;
the default is 0, because a noisy teacher mostly teaches noise: with 192 episodes per env the small
model reached a held-out return of 0.29 imitating 20% noise and 0.77 / 0.53 (two seeds) imitating
none, still short of solving three of the four envs (docs/results.md, "The CPU quickstart").

The samples are made by the rollout engine itself (``spade_cli.rollout.episodes.Engine``) in the real
sandbox, with a scripted backend in place of the model, so prompt, chat template, splicing and the
agent-token mask are exactly what ``spade rollout`` produces; only the replies differ.

Seeds: rollout and eval draw every env seed from a hash truncated to 31 bits (``episode_seed``), so
the warm start plays seeds from ``SEED_BASE = 2**31`` up: no episode the loop or an ``envs:`` eval
ever plays shares a seed with one it was warm-started on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

SEED_BASE = 2**31  # above every seed `episode_seed` can return (it keeps 31 bits)

USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)

Policy = Callable[[list[str], random.Random, float], str]


def _last(pattern: str, obs: list[str]) -> str | None:
    """The last match of ``pattern`` in the latest observation that has one."""
    for text in reversed(obs):
        found = re.findall(pattern, text)
        if found:
            return found[-1]
    return None


def _answer(correct: str | None, choices: list[str], rng: random.Random, noise: float) -> str:
    """The right reply, or with probability ``noise`` one of the env's possible replies at random."""
    if correct is None or rng.random() < noise:
        return rng.choice(choices)
    return correct


# What each starter env accepts (spade_cli/data/starter/): a solver knows its env's rules.
RELAY_WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano"]
SIGNALS = {"red": "stop", "yellow": "wait", "green": "go"}
LETTERS = "abcdefghijklmnopqrstuvwxyz"
OPPOSITES = {"hot": "cold", "up": "down", "big": "small", "fast": "slow", "day": "night", "wet": "dry"}


def relay_word(obs: list[str], rng: random.Random, noise: float) -> str:
    """Repeat the word the radio sent last."""
    return _answer(_last(r"Radio: (\w+)\.", obs), RELAY_WORDS, rng, noise)


def signal_rules(obs: list[str], rng: random.Random, noise: float) -> str:
    """Answer the light with its move (the env's own hint)."""
    light = _last(r"Light: (\w+)\.", obs)
    return _answer(SIGNALS.get(light or ""), list(SIGNALS.values()), rng, noise)


def next_letter(obs: list[str], rng: random.Random, noise: float) -> str:
    """The letter after the one shown."""
    letter = _last(r"Letter: ([a-y])\.", obs)
    return _answer(LETTERS[LETTERS.index(letter) + 1] if letter else None, list(LETTERS[1:]), rng, noise)


def opposites(obs: list[str], rng: random.Random, noise: float) -> str:
    """The opposite of the word asked about."""
    word = _last(r"Opposite of (\w+)\?", obs)
    return _answer(OPPOSITES.get(word or ""), list(OPPOSITES.values()), rng, noise)


SOLVERS: dict[str, Policy] = {"relay_word": relay_word, "signal_rules": signal_rules,
                             "next_letter": next_letter, "opposites": opposites}


def space_policy(env: dict) -> Policy | None:
    """The solver of a design-space env (``spade_cli.designer.space``): its rule applied to the last cue."""
    spec = env.get("spec")
    if not spec:
        return None
    from spade_cli.designer import space

    def policy(obs: list[str], rng: random.Random, noise: float) -> str:
        right = space.solve(obs[-1], spec["rule"]) if obs else None
        return right if right is not None and rng.random() >= noise else "?"
    return policy


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
    from spade_cli.rollout.episodes import Engine, EnvSource, EpisodeSpec, PlayConfig, episode_id
    from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool

    cfg = PlayConfig(max_turns=max_turns, thinking=enable_thinking, temperature=0.0, seed=seed)
    rows: list[Any] = []
    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        for env in envs:
            policy = SOLVERS.get(env["name"]) or space_policy(env)
            if policy is None:
                continue
            env_id = f"warmstart-{env['name']}"
            # a practice env of the design space shows a random cue, so only its hint says what to
            # do: it is played hinted only (the warm start teaches reading a hint, not the cues)
            sides = (True,) if env["name"].startswith("practice_") else (False, True)
            specs = [EpisodeSpec(episode_id(seed, -1, env_id, p, h), env_id, -1, h, SEED_BASE + seed * episodes + p, p)
                     for p in range(episodes) for h in sides]
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
