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
from typing import Any

from spade_cli.core.records import Rollout


@dataclass(frozen=True)
class PlayConfig:
    max_turns: int = 16
    max_new_tokens: int = 512
    max_episode_tokens: int = 8192
    max_action_chars: int = 2000
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    enable_thinking: bool = True
    think_tokens: int | None = None  # set: reasoning and answer get their own budgets (two phases)
    answer_tokens: int | None = None  # default: max_new_tokens
    think_overflow: str = "close"  # close | end (spade_cli.backends.thinking)
    think_context: str = "auto"  # keep | drop | auto: earlier reasoning in the context or not
    error_return: float = 0.0
    quarantine_after: int = 3
    # every episode of one iteration of the paper's loop (24 envs x 8 pairs x 2 = 384) at once, with room
    max_concurrent: int = 512
    env_threads: int = 8
    seed: int = 0


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
