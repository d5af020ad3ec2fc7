"""The state of episodes in play: their configuration, specs, token streams and counters.

Plain dataclasses shared by the lockstep engine (``spade_cli.rollout.episodes``) and the continuous one
(``spade_cli.rollout.episodes_continuous``); neither engine is imported here, so both import this module at
the top. ``Episode.record`` turns a finished episode into its ``spade.rollout/1`` row (the token
layout: docs/architecture.md, 'Records').
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from spade_cli.core.records import Rollout
from spade_cli.core.settings import setting

GEN = "Generation"  # help panels of `spade rollout`
PLAY = "Episodes"


@dataclass(frozen=True)
class PlayConfig:
    """How episodes are played: `spade rollout`'s options are built from these fields (and `spade
    eval`'s envs: tasks play by them)."""

    max_turns: int = setting(16, "Turn cap; reaching it truncates.", panel=PLAY, min=1)
    max_episode_tokens: int = setting(8192, "Context budget: prompt + all later tokens of an episode.",
                                      panel=PLAY, min=16)
    max_action_chars: int = setting(2000, "Cut the action sent to step to this many characters.", panel=PLAY,
                                    min=1)
    error_return: float = setting(0.0, "Return recorded for an episode that ends with an env error, in [-1, 1].",
                                  panel=PLAY, min=-1.0, max=1.0)
    quarantine_after: int = setting(3, "Errors after which an env's remaining episodes are not played.",
                                    panel=PLAY, min=1)
    temperature: float = setting(1.0, "Sampling temperature.", panel=GEN, min=0)
    top_p: float = setting(1.0, "Nucleus sampling.", panel=GEN, min=0, max=1)
    top_k: int = setting(0, "0: off.", panel=GEN, min=0)
    max_tokens: int = setting(512, "Token cap of one reply.", panel=GEN, min=1)
    # On, as design and warmstart: Qwen3's template default and the mode its model card recommends
    # for reasoning and agentic use; a template without a thinking mode ignores it.
    thinking: bool = setting(True, "Let the agent think (<think> block) before acting (on: Qwen3's own "
                             "default; a template without thinking ignores it).", panel=GEN)
    think_tokens: int | None = setting(None, "Reasoning budget of one reply; set: reasoning and answer are "
                                       "generated in two phases.", panel=GEN, min=1)
    answer_tokens: int | None = setting(None, "Answer budget with --think-tokens (default: --max-tokens).",
                                        panel=GEN, min=1)
    think_overflow: Literal["close", "end"] = setting(
        "close", "Reasoning out of budget: close (spade appends </think>, masked) or end (empty action, "
        "recorded).", panel=GEN)  # spade_cli.backends.thinking.OVERFLOW
    think_context: Literal["keep", "drop", "auto"] = setting(
        "auto", "Earlier reasoning in the context: keep, drop, or auto (as the chat template does).",
        panel=GEN)  # spade_cli.backends.thinking.CONTEXTS
    # every episode of one iteration of the paper's loop (24 envs x 8 pairs x 2 = 384) at once, with room
    max_concurrent: int = setting(
        512, "Episodes in flight: the batch of one generate call (hf: one model.generate); with continuous "
        "batching, the requests in flight. The default holds the 384 episodes of one iteration (24 envs x 8 "
        "pairs x 2).", panel=GEN, min=1)
    workers: int = setting(8, "Sandbox workers stepping envs at once (as validate's --workers; --threads: "
                           "torch's).", min=1)
    seed: int = setting(0, "Run seed; every derived seed comes from it.")


@dataclass(frozen=True)
class EnvSource:
    env_id: str
    code: str
    hint: str


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: str
    env_id: str
    iteration: int
    hinted: bool
    seed: int
    pair: int


@dataclass
class Episode:
    spec: EpisodeSpec
    messages: list[dict] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    text: str = ""  # the decoded token stream so far (= the rendered chat)
    first_obs: str = ""
    turns: list[dict] = field(default_factory=list)
    ret: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    stop: str | None = None
    pending: str | None = None  # the action of the current tick, not yet stepped
    closed: bool = False  # the token stream ends with the template's end of the last reply
    gen_tokens: int = 0
    per_turn: bool = False  # spliced turn by turn: the template rewrites history (see _turn_suffix)
    worker: Any = None  # the worker holding this episode's env; another one means replay first
    context: list[int] | None = None  # think_context drop: the next prompt as the model sees it
    turn_prompts: list[dict] = field(default_factory=list)  # drop: each turn's prompt and reply span
    reply_ends: list[int] = field(default_factory=list)  # where each reply ends in completion_ids
    last_prompt: list[int] = field(default_factory=list)
    pending_info: dict = field(default_factory=dict)  # reasoning figures of the pending reply

    def gen_prompt(self) -> list[int]:
        return self.context if self.context is not None else self.prompt_ids + self.completion_ids

    @property
    def context_tokens(self) -> int:
        """What the episode budget bounds: the context of the next reply."""
        return len(self.context) if self.context is not None else self.n_tokens

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def record(self, error_return: float, think_context: str = "keep") -> Rollout:
        s = self.spec
        return Rollout(
            episode_id=s.episode_id, env_id=s.env_id, iteration=s.iteration, hinted=s.hinted,
            seed=s.seed, pair=s.pair, messages=self.messages, turns=self.turns,
            return_=error_return if self.error else self.ret, terminated=self.terminated,
            truncated=self.truncated, error=self.error,
            tokens={"prompt_ids": self.prompt_ids, "completion_ids": self.completion_ids,
                    "env_mask": self.env_mask, "logprobs": self.logprobs,
                    "think_context": think_context, "reply_ends": self.reply_ends,
                    **({"turns": self.turn_prompts} if think_context == "drop" else {})},
            extra={"stop": self.stop, "agent_tokens": self.gen_tokens,
                   "splicing": "per_turn" if self.per_turn else "rendered"},
        )


@dataclass
class Stats:
    """Counters the progress display and the benchmark read."""

    total: int = 0
    done: int = 0
    turns: int = 0
    ticks: int = 0
    calls: int = 0
    gen_tokens: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0
    env_steps: int = 0
    started: float = field(default_factory=time.perf_counter)
    errors: Counter = field(default_factory=Counter)
    quarantined: list[str] = field(default_factory=list)
