"""The episode engine behind `spade rollout`: many multi-turn episodes, lockstep or continuous.

Lockstep (``batching="lockstep"``, the hf and offline vllm backends): every active episode takes
one turn per *tick*: one batched ``backend.generate`` call produces the replies of all of them,
then the environment steps run in the sandbox workers, one thread per worker, in parallel with
each other. Finished episodes leave the batch and queued ones take their place (up to
``max_concurrent``), so the batch stays full without a second generate call per tick. hf and
``vllm.LLM`` are synchronous, in-process engines: a call returns when its whole batch is done, so
one big call per tick is what keeps them busy.

Continuous (``batching="continuous"``, backends with ``continuous = True``: ``openai``, whose
server batches whatever requests are in flight): each episode advances on its own, up to
``max_concurrent`` at a time, so env steps of one episode overlap generation of the others and a
long reply holds back only its own episode. ``episodes_continuous`` runs it with this class's
methods, so tokens, seeds, errors and rows are the same as in lockstep.

Token bookkeeping. The first prompt is the chat template rendered over ``[system, first
observation]``. Everything after it goes to ``completion_ids``: the sampled ids of each reply
(``env_mask`` 1, the sampler's log-probabilities) and, between replies, the ids of the text that
the template puts between the end of the reply and the next generation prompt (``env_mask`` 0,
log-probability null). That text is found by rendering the chat as text and taking what follows
the text decoded so far, so ``decode(prompt_ids + completion_ids)`` equals the rendered final chat
by construction; a reply cut by ``max_tokens`` (no EOS) simply gets the template's turn-end token
as an env token. The sampled ids are kept as sampled (never re-tokenized), because training must
score exactly the tokens the sampler produced. With an append-only chat template (spade's tiny model
has one) the stream equals the rendered final chat. A template that rewrites earlier turns (stock
Qwen3 drops old ``<think>`` blocks) is spliced turn by turn instead: the reply's end as the
template writes it, then the new user turn rendered on its own — the tokens the model actually saw.

Environments are deterministic given the seed and the actions (docs/architecture.md, 'The environment contract'). The engine uses that
when a worker process dies: each episode remembers the worker it lives on, and one that shared the
dead worker is rebuilt on the replacement by replaying its actions before its next step; a replay
that does not reproduce the recorded observations ends the episode as ``nondeterministic``.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spade_cli.backends import Sampling, keyed, render_chat
from spade_cli.backends.thinking import Thinking, answer_only, generate_thinking, resolve_think_context
from spade_cli.core.artifacts import SpadeError
from spade_cli.core.records import Rollout
from spade_cli.rollout.episode_state import (  # noqa: F401  (re-exported: stages import them from here)
    EnvSource,
    Episode,
    EpisodeSpec,
    PlayConfig,
    Stats,
)
from spade_cli.rollout.episodes_continuous import Continuous
from spade_cli.rollout.seeds import (  # noqa: F401  (re-exported: stages import them from here)
    budget_pairs,
    episode_id,
    episode_seed,
    episode_specs,
    seed_key,
    seed_material,
    turn_seed,
)
from spade_cli.sandbox.checks import hint_leaks, normalize, return_in_range

SYSTEM_PROMPT = (
    "You are an agent playing a text environment, one turn at a time. Each user message is the "
    "environment's observation. Reply with your next action as plain text; only the text after "
    "any <think>...</think> block is sent to the environment, cut to {max_chars} characters. "
    "The episode ends when the environment says so, or after {max_turns} turns. Your goal is to "
    "solve the task: the environment rewards a solved task with a total reward of 1."
)
HINT_BLOCK = "\n\nA hint about this environment, written by its designer:\n{hint}"
LEAK_NOTE = "[observation withheld: it contained the hint]"
THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


def system_message(hint: str | None, cfg: PlayConfig) -> str:
    text = SYSTEM_PROMPT.format(max_chars=cfg.max_action_chars, max_turns=cfg.max_turns)
    return text + HINT_BLOCK.format(hint=hint) if hint else text


def to_action(reply: str, max_chars: int) -> str:
    """What goes to ``step``: the reply without its think block (an unclosed one is dropped whole,
    the model never finished thinking), stripped and cut to ``max_chars``."""
    text = THINK_RE.sub("", reply)
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()[:max_chars]


def _unclosed(reply: str) -> bool:
    """The reply opened a reasoning block it never closed (it has no answer)."""
    return "<think>" in THINK_RE.sub("", reply)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TemplateError(SpadeError):
    """The chat template rewrote earlier turns, so env tokens cannot be spliced exactly."""


class Engine:
    """Plays episode specs against a backend and a sandbox pool; see the module docstring.

    ``emit(rollout)`` is called once per finished episode (the stage writes it to disk);
    ``progress(stats)`` after every tick (continuous: after every episode-turn, never from two
    threads at once). ``env_error`` is the sandbox's ``EnvError`` (any exception class with a
    ``reason`` attribute, for tests with a stand-in pool). ``batching`` is ``lockstep`` or
    ``continuous`` (the stage resolves ``auto`` from the backend).
    """

    def __init__(self, backend: Any, pool: Any, envs: dict[str, EnvSource], cfg: PlayConfig,
                 emit: Callable[[Rollout], None], progress: Callable[[Stats], None] | None = None,
                 env_error: type[Exception] | None = None, batching: str = "lockstep"):
        if env_error is None:
            from spade_cli.sandbox import EnvError as env_error
        if batching not in ("lockstep", "continuous"):
            raise ValueError(f"batching must be lockstep or continuous, got {batching!r}")
        self.batching = batching
        self.EnvError = env_error
        self.backend, self.pool, self.envs, self.cfg = backend, pool, envs, cfg
        self.tok = backend.tokenizer
        self.eos = self.tok.eos_token_id
        self.emit, self.progress = emit, progress or (lambda s: None)
        self.workers: dict[str, Any] = {}
        self._norm_hints: dict[str, str] = {}
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.bad: dict[str, str] = {}  # quarantined env -> reason
        self.stats = Stats()
        self._turn_parts: tuple | None = None
        self.think_context = resolve_think_context(self.tok, cfg)
        self.thinking = None
        if cfg.think_tokens is not None:
            self.thinking = Thinking(cfg.think_tokens, cfg.answer_tokens or cfg.max_tokens,
                                     cfg.think_overflow).bind(self.tok)
        self.sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                 max_tokens=cfg.max_tokens)

    # -- rendering ---------------------------------------------------------------------------
    def _render_text(self, messages: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                            enable_thinking=self.cfg.thinking)

    def _splice_env(self, ep: Episode, gen: bool) -> None:
        """Append, as env tokens, whatever the template renders after the text so far."""
        full = self._render_text(ep.messages, gen)
        if full.startswith(ep.text):
            suffix = full[len(ep.text):]
        else:
            suffix = self._turn_suffix(ep, gen)
            ep.per_turn = True
        ids = self.tok.encode(suffix, add_special_tokens=False)
        ep.completion_ids += ids
        ep.env_mask += [0] * len(ids)
        ep.logprobs += [None] * len(ids)
        ep.text += suffix
        ep.closed = not gen

    def _turn_suffix(self, ep: Episode, gen: bool) -> str:
        """For a template that rewrites history (stock Qwen3 drops earlier ``<think>`` blocks):
        what the model sees when the chat grows by one turn — the end of the reply as the template
        writes it, then the new user turn and generation prompt rendered on their own. The tokens
        stay exactly those the model was sampled with; they no longer equal a re-rendering of the
        final chat, and the row says so (``splicing: per_turn``)."""
        if self._turn_parts is None:
            eos = self.tok.eos_token or ""
            base = [{"role": "system", "content": "s"}]
            head = self._render_text(base, False)
            if not eos or eos not in head:
                raise TemplateError("the chat template rewrites earlier turns and does not end a turn with "
                                    "the EOS token; spade cannot splice environment tokens for it")
            self._turn_parts = (eos, head[head.rindex(eos) + len(eos):], base, head)
        eos, sep, base, head = self._turn_parts
        out = ("" if ep.text.endswith(eos) else eos) + sep
        if gen:
            turn = self._render_text(base + [ep.messages[-1]], True)
            if not turn.startswith(head):
                raise TemplateError("the chat template renders a user turn differently after a system "
                                    "message; spade cannot splice environment tokens for it")
            out += turn[len(head):]
        return out

    # -- workers -----------------------------------------------------------------------------
    def _worker(self, env_id: str) -> Any:
        w = self.workers.get(env_id)
        if w is None or not w.alive:
            if w is not None:
                w.close()
            src = self.envs[env_id]
            w = self.workers[env_id] = self.pool.open(src.code, env_id)
        return w

    def _drop_worker(self, env_id: str) -> None:
        w = self.workers.pop(env_id, None)
        if w is not None:
            w.close()

    def _parallel(self, jobs: dict[str, list[Episode]], fn: Callable[[Any, Episode], Any],
                  ) -> list[tuple[Episode, Any]]:
        """Run ``fn(worker, ep)`` for every episode, one thread per worker (calls on one worker
        are sequential); after a worker dies its remaining episodes get the marker 'lost'."""

        def run_worker(env_id: str, eps: list[Episode]) -> list[tuple[Episode, Any]]:
            out: list[tuple[Episode, Any]] = []
            try:
                w = self._worker(env_id)
            except self.EnvError as exc:
                return [(ep, exc) for ep in eps]
            for ep in eps:
                if not w.alive:
                    out.append((ep, "lost"))
                    continue
                try:
                    out.append((ep, fn(w, ep)))
                except self.EnvError as exc:
                    out.append((ep, exc))
            return out

        t0 = time.perf_counter()
        results: list[tuple[Episode, Any]] = []
        with ThreadPoolExecutor(max_workers=max(1, min(self.cfg.workers, len(jobs)))) as ex:
            for part in ex.map(lambda kv: run_worker(*kv), list(jobs.items())):
                results += part
        self.stats.env_s += time.perf_counter() - t0
        return results

    # -- episode lifecycle -------------------------------------------------------------------
    def _finish(self, ep: Episode, stop: str, error: str | None = None) -> None:
        ep.stop, ep.error = stop, error
        if ep.messages and ep.messages[-1]["role"] == "assistant" and not ep.closed:
            self._splice_env(ep, gen=False)  # close the last reply the way the template does
        if error:
            self.stats.errors[error] += 1
        w = self.workers.get(ep.spec.env_id)
        if w is not None and w.alive and stop != "quarantined":
            try:
                w.close_episode(ep.spec.episode_id)
            except self.EnvError:
                pass
        self.emit(ep.record(self.cfg.error_return, self.think_context))
        self.stats.done += 1

    def _fail(self, ep: Episode, reason: str) -> None:
        self.errors[ep.spec.env_id].append(reason)
        self._finish(ep, "error", reason)
        if len(self.errors[ep.spec.env_id]) >= self.cfg.quarantine_after:
            self.bad.setdefault(ep.spec.env_id, Counter(self.errors[ep.spec.env_id]).most_common(1)[0][0])

    def _start(self, spec: EpisodeSpec, obs: str) -> Episode:
        hint = self.envs[spec.env_id].hint if spec.hinted else None
        ep = Episode(spec, first_obs=obs)
        ep.messages = [{"role": "system", "content": system_message(hint, self.cfg)},
                       {"role": "user", "content": obs}]
        ep.prompt_ids = render_chat(self.tok, ep.messages, enable_thinking=self.cfg.thinking)
        ep.text = self._render_text(ep.messages, True)
        if self.think_context == "drop":
            ep.context = list(ep.prompt_ids)
            ep.last_prompt = ep.prompt_ids
        return ep

    def _drop_context(self, ep: Episode) -> list[int]:
        """The next prompt with every earlier turn's reasoning removed (think_context drop)."""
        chat = [{**m, "content": answer_only(m["content"])} if m["role"] == "assistant" else m
                for m in ep.messages]
        return render_chat(self.tok, chat, enable_thinking=self.cfg.thinking)

    def _leaks(self, env_id: str, obs: str) -> bool:
        """validate's own hint-leak check (case and spacing ignored), enforced again here."""
        hint = self._norm_hints.get(env_id)
        if hint is None:
            hint = self._norm_hints[env_id] = normalize(self.envs[env_id].hint or "")
        return hint_leaks(None, obs, normalized_hint=hint)

    def _reset_all(self, specs: list[EpisodeSpec]) -> list[Episode]:
        jobs: dict[str, list[Episode]] = defaultdict(list)
        for spec in specs:
            jobs[spec.env_id].append(Episode(spec))
        started = []
        for ep, res in self._parallel(jobs, lambda w, ep: (w.reset(ep.spec.episode_id, ep.spec.seed)[0], w)):
            if res == "lost":  # another episode killed the worker: retry on a fresh one next tick
                self.queue.appendleft(ep.spec)
            elif isinstance(res, self.EnvError):
                self._note_dead(ep.spec.env_id)
                self._fail(ep, res.reason)
            elif self._leaks(ep.spec.env_id, res[0]):
                self._fail(ep, "hint_leak")
            else:
                ep = self._start(ep.spec, res[0])
                ep.worker = res[1]
                if ep.context_tokens + 1 > self.cfg.max_episode_tokens:  # the first prompt fills the budget
                    ep.truncated = True
                    self._finish(ep, "max_episode_tokens")
                else:
                    started.append(ep)
        return started

    def _note_dead(self, env_id: str) -> None:
        w = self.workers.get(env_id)
        if w is not None and not w.alive:
            self._drop_worker(env_id)

    def _replay(self, w: Any, ep: Episode) -> Any:
        """Rebuild an episode on a fresh worker from its seed and actions, then take its turn."""
        obs, _ = w.reset(ep.spec.episode_id, ep.spec.seed)
        if obs != ep.first_obs:
            return "nondeterministic"
        for turn in ep.turns:
            got = w.step(ep.spec.episode_id, turn["action"])
            if got[0] != turn["observation"] or float(got[1]) != turn["reward"]:
                return "nondeterministic"
        return w.step(ep.spec.episode_id, ep.pending)

    def _take_step(self, w: Any, ep: Episode) -> Any:
        """Step the pending action on ``w``. An episode whose env lives on another worker (one that
        died, even after this episode's last step went through) is first rebuilt on ``w``."""
        stale, ep.worker = ep.worker is not w, w
        return self._replay(w, ep) if stale else w.step(ep.spec.episode_id, ep.pending)

    def _apply(self, ep: Episode, res: Any) -> bool:
        """Take one step result into the episode; True when it goes on."""
        if isinstance(res, self.EnvError):
            self._fail(ep, res.reason)
            return False
        if isinstance(res, str):  # a replay that did not reproduce the episode
            self._fail(ep, res)
            return False
        obs, reward, terminated, truncated, _info = res
        leak = self._leaks(ep.spec.env_id, obs)
        ep.turns.append({"action": ep.pending, "observation": LEAK_NOTE if leak else obs,
                         "reward": float(reward), **ep.pending_info})
        ep.ret += float(reward)
        self.stats.turns += 1
        if leak:  # the hint must never reach an unhinted episode, not even in its record
            self._fail(ep, "hint_leak")
            return False
        cap_turns = len(ep.turns) >= self.cfg.max_turns
        ep.terminated, ep.truncated = bool(terminated), bool(truncated) or cap_turns
        if terminated or truncated or cap_turns:
            self._end(ep, "env" if terminated or truncated else "max_turns")
            return False
        ep.messages.append({"role": "user", "content": obs})
        before = (len(ep.messages), ep.text, len(ep.completion_ids), ep.context)
        self._splice_env(ep, gen=True)
        if ep.context is not None:
            ep.context = self._drop_context(ep)
        if ep.context_tokens + 1 > self.cfg.max_episode_tokens:  # no room for even one more agent token
            ep.messages.pop()
            ep.text, ep.context = before[1], before[3]
            del ep.completion_ids[before[2]:], ep.env_mask[before[2]:], ep.logprobs[before[2]:]
            ep.truncated = True
            self._end(ep, "max_episode_tokens")
            return False
        return True

    def _end(self, ep: Episode, stop: str) -> None:
        """A regular end; the return is checked against the contract's [0, 1] only here, since
        rewards of either sign may be summed along the way."""
        if not return_in_range(ep.ret):
            self._fail(ep, "return_out_of_range")
        else:
            self._finish(ep, stop)

    def _generate(self, eps: list[Episode]) -> list[Any]:
        """One reply per episode, in one backend call (two with reasoning budgets)."""
        prompts = [ep.gen_prompt() for ep in eps]
        seeds = [turn_seed(ep.spec.episode_id, len(ep.turns)) for ep in eps]
        keys = [ep.spec.episode_id for ep in eps]  # an episode's turns to one engine, which holds its prefix
        if self.thinking is not None:
            outs = generate_thinking(self.backend, prompts, 1, self.sampling, self.thinking, seeds=seeds, keys=keys)
        else:
            outs = self.backend.generate(prompts, 1, self.sampling, seeds=seeds, **keyed(self.backend, keys))
        return [group[0] for group in outs]

    def _absorb(self, ep: Episode, sample: Any) -> None:
        """Append a sampled reply (cut to the context budget) and set the pending action. Tokens
        spade appended itself (a forced ``</think>``) are env tokens: mask 0, log-prob null."""
        room = max(0, self.cfg.max_episode_tokens - ep.context_tokens)
        ids = list(sample.token_ids)[:room]
        lps = list(sample.logprobs) if sample.logprobs is not None else [None] * len(sample.token_ids)
        mask = list(sample.extra.get("sampled_mask") or [1] * len(sample.token_ids))[:len(ids)]
        lps = [lp if m else None for lp, m in zip(lps, mask, strict=False)]
        start = len(ep.completion_ids)
        if ep.context is not None:  # drop: this turn trains as its own sequence (spade_cli.training.samples)
            keep = _common_prefix(ep.last_prompt, ep.context)
            ep.turn_prompts.append({"prefix": keep, "ids": ep.context[keep:], "start": start,
                                    "end": start + len(ids)})
            ep.last_prompt = ep.context
            ep.context = ep.context + ids
        ep.completion_ids += ids
        ep.env_mask += mask
        ep.logprobs += lps
        ep.reply_ends.append(len(ep.completion_ids))  # per-turn credit (spade_cli.training.samples) needs the spans
        ep.gen_tokens += sum(mask)
        self.stats.gen_tokens += sum(mask)
        body = ids[:-1] if ids and ids[-1] == self.eos else ids
        reply = self.tok.decode(body, skip_special_tokens=False)
        ep.text += self.tok.decode(ids, skip_special_tokens=False)
        ep.messages.append({"role": "assistant", "content": reply})
        ep.pending = to_action(reply, self.cfg.max_action_chars)
        overflow = bool(sample.extra.get("think_overflow")) or _unclosed(reply)
        ep.pending_info = {k: sample.extra[k] for k in ("think_tokens", "answer_tokens") if k in sample.extra}
        if self.cfg.thinking:
            ep.pending_info["think_overflow"] = overflow
        if overflow and (self.thinking is None or self.thinking.overflow == "end"):
            ep.pending = ""  # said so in the turn (think_overflow), never silently

    def _quarantine(self, active: list[Episode]) -> list[Episode]:
        """Finish every active and queued episode of a quarantined env with its main reason."""
        if not self.bad:
            return active
        for env_id in self.bad:
            if env_id not in self.stats.quarantined:
                self.stats.quarantined.append(env_id)
                self._drop_worker(env_id)
        keep = []
        for ep in active:
            if ep.spec.env_id in self.bad:
                self._finish(ep, "quarantined", self.bad[ep.spec.env_id])
            else:
                keep.append(ep)
        queued = [s for s in self.queue if s.env_id in self.bad]
        if queued:
            self.queue = deque(s for s in self.queue if s.env_id not in self.bad)
            for spec in queued:
                self._finish(Episode(spec), "quarantined", self.bad[spec.env_id])
        return keep

    # -- the loop ----------------------------------------------------------------------------
    def run(self, specs: list[EpisodeSpec]) -> Stats:
        if self.batching == "continuous":
            return Continuous(self).run(specs)
        cfg = self.cfg
        self.queue: deque[EpisodeSpec] = deque(specs)
        self.stats.total = len(specs)
        active: list[Episode] = []
        try:
            while True:
                room = cfg.max_concurrent - len(active)
                if room > 0 and self.queue:
                    batch = [self.queue.popleft() for _ in range(min(room, len(self.queue)))]
                    active += self._reset_all(batch)
                active = self._quarantine(active)
                if not active:
                    if not self.queue:
                        break
                    continue
                self._tick(active)
                active = self._quarantine([ep for ep in active if ep.stop is None])
                left = Counter(ep.spec.env_id for ep in active) + Counter(s.env_id for s in self.queue)
                for env_id in list(self.workers):  # close workers whose env has nothing left
                    if not left[env_id]:
                        self._drop_worker(env_id)
                self.progress(self.stats)
        finally:
            for env_id in list(self.workers):
                self._drop_worker(env_id)
        self.progress(self.stats)
        return self.stats

    def _tick(self, active: list[Episode]) -> None:
        t0 = time.perf_counter()
        outs = self._generate(active)
        self.stats.gen_s += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.ticks += 1
        jobs: dict[str, list[Episode]] = defaultdict(list)
        for ep, sample in zip(active, outs, strict=True):
            self._absorb(ep, sample)
            jobs[ep.spec.env_id].append(ep)
        results = self._parallel(jobs, self._take_step)
        lost: dict[str, list[Episode]] = defaultdict(list)
        for ep, res in results:
            if isinstance(res, self.EnvError):
                self._note_dead(ep.spec.env_id)
            if res == "lost":
                lost[ep.spec.env_id].append(ep)
                continue
            self._apply(ep, res)
        # Episodes that shared a worker that died: replay them on a fresh one. Each round settles
        # at least the first episode of every worker, so the loop ends.
        while lost:
            for env_id in lost:
                self._note_dead(env_id)
            again: dict[str, list[Episode]] = defaultdict(list)
            for ep, res in self._parallel(lost, self._take_step):
                if res == "lost":
                    again[ep.spec.env_id].append(ep)
                    continue
                if isinstance(res, self.EnvError):
                    self._note_dead(ep.spec.env_id)
                self._apply(ep, res)
            lost = again
        self.stats.env_steps += len(results)
