"""Continuous batching for the episode engine: every episode advances on its own.

A server behind the ``openai`` backend (vLLM, SGLang) batches whatever requests are in flight at
each of its own steps. Lockstep play wastes that: a tick waits for its longest reply, and the
server idles while the env steps run. Here each episode runs in one thread of a pool of
``max_concurrent``: generate (its own prompt, ``n=1``, the seed of its episode and turn, the same
``turn_seed`` lockstep uses) → absorb → step on its env's worker → apply, until it ends; then the
thread takes the next queued spec. Env steps of one episode overlap generation of the others.

Every piece of an episode's turn is the lockstep engine's own method (``Engine._absorb``,
``_take_step``, ``_apply``, ``_finish``, ``_fail``), so tokens, seeds, errors, the context budget
and hint-leak checks are the same; given a backend whose replies depend only on prompt and seed,
the rows are the same as lockstep's. What may differ is timing-dependent only: which episodes of
an env are already over when it is quarantined (``stop: quarantined`` rows), and the order in
which rows are written.

Locks, always taken in this order and never the other way round:

* one lock per env, held around every call on that env's worker and its replacement (a sandbox
  worker serves one call at a time; different workers run in parallel);
* the engine lock, around the state all threads share: stats, ``emit``, error counts and
  quarantine, and the tokenizer (a fast tokenizer's Rust core is not promised to be safe under
  concurrent calls).

Generation holds neither, which is the point. An episode reaching quarantine is finished before
its next reply is generated or, if its reply is already out, before its step (that row then ends
with an unstepped reply, its env tokens closed as usual).

Dead workers: each episode remembers the worker it was reset or last stepped on. One whose env's
worker has since been replaced (another episode's step killed it) is rebuilt on the new worker by
replaying its seed and actions before its step (``Engine._take_step``), under the env lock, so
several episodes of one env never race to rebuild.

Stats: ``calls`` and ``ticks`` count generate calls (one per episode-turn); ``gen_s`` and
``env_s`` are wall time during which at least one generate call (env call) was in flight, so
``gen_tokens / gen_s`` is still throughput and not divided by the overlap.

    stats = Engine(backend, pool, envs, PlayConfig(max_concurrent=64), emit, batching="continuous").run(specs)
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from spade_cli.rollout.episode_state import Episode, EpisodeSpec, Stats

if TYPE_CHECKING:  # the lockstep engine imports this module; it is only a type here
    from spade_cli.rollout.episodes import Engine


class _Clock:
    """Wall time during which at least one call of a kind was in flight."""

    def __init__(self, stats: Stats, attr: str) -> None:
        self.stats, self.attr, self.busy, self.t0, self.lock = stats, attr, 0, 0.0, threading.Lock()

    @contextmanager
    def running(self):
        with self.lock:
            if not self.busy:
                self.t0 = time.perf_counter()
            self.busy += 1
        try:
            yield
        finally:
            with self.lock:
                self.busy -= 1
                if not self.busy:
                    setattr(self.stats, self.attr, getattr(self.stats, self.attr) + time.perf_counter() - self.t0)


class Continuous:
    """One run of ``engine`` with continuous batching; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.lock = threading.RLock()
        self.env_lock = {env_id: threading.Lock() for env_id in engine.envs}
        self.gen_clock = _Clock(engine.stats, "gen_s")
        self.env_clock = _Clock(engine.stats, "env_s")
        self.failed = threading.Event()  # an exception that is no env's fault stops every thread
        self.first = threading.Lock()
        self.probed = threading.Event()

    def run(self, specs: list[EpisodeSpec]) -> Stats:
        e = self.e
        self.queue: deque[EpisodeSpec] = deque(specs)
        self.left = Counter(s.env_id for s in specs)  # episodes of an env not finished yet
        e.stats.total = len(specs)
        try:
            n = max(1, min(e.cfg.max_concurrent, len(specs)))
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="episode") as ex:
                futures = [ex.submit(self._runner) for _ in range(n)]
            for f in futures:
                f.result()  # the first error of a thread, once all have stopped
        finally:
            for env_id in list(e.workers):
                e._drop_worker(env_id)
        e.progress(e.stats)
        return e.stats

    def _runner(self) -> None:
        try:
            while not self.failed.is_set():
                with self.lock:
                    if not self.queue:
                        return
                    spec = self.queue.popleft()
                self._play(spec)
        except BaseException:
            self.failed.set()
            raise

    # -- one episode -------------------------------------------------------------------------
    def _play(self, spec: EpisodeSpec) -> None:
        e, env_id = self.e, spec.env_id
        ep = self._reset(spec)
        while ep is not None and not self.failed.is_set():
            with self.env_lock[env_id], self.lock:
                if self._quarantined(ep):
                    break
            sample = self._generate(ep)
            with self.lock:
                e.stats.calls += 1
                e.stats.ticks += 1
                e._absorb(ep, sample)
            with self.env_lock[env_id]:
                with self.lock:
                    if self._quarantined(ep):
                        break
                res = self._call(env_id, e._take_step, ep)
                with self.lock:
                    e.stats.env_steps += 1
                    if not e._apply(ep, res):
                        ep = None
                    self._settle(env_id)
                    e.progress(e.stats)
        if self.failed.is_set() and ep is not None:
            return  # left unfinished and unwritten: a rerun plays it
        with self.env_lock[env_id], self.lock:
            self.left[env_id] -= 1
            if not self.left[env_id]:  # the env has nothing left: close its worker
                e._drop_worker(env_id)

    def _generate(self, ep: Episode) -> Any:
        """One reply. The first call of the run goes alone: a backend may probe the server with it
        (openai finds its wire mode there), and concurrent probes would race on the answer."""
        if not self.probed.is_set():
            with self.first:
                if not self.probed.is_set():
                    try:
                        return self._generate_now(ep)
                    finally:
                        self.probed.set()
        return self._generate_now(ep)

    def _generate_now(self, ep: Episode) -> Any:
        with self.gen_clock.running():
            [sample] = self.e._generate([ep])
        return sample

    def _reset(self, spec: EpisodeSpec) -> Episode | None:
        """The started episode, or None when it already ended (error, leak, quarantine, budget)."""
        e, env_id = self.e, spec.env_id
        with self.env_lock[env_id]:
            with self.lock:
                if self._quarantined(Episode(spec)):
                    return None
            res = self._call(env_id, lambda w, ep: (w.reset(spec.episode_id, spec.seed)[0], w), Episode(spec))
            with self.lock:
                ep = None
                if isinstance(res, e.EnvError):
                    e._fail(Episode(spec), res.reason)
                elif e._leaks(env_id, res[0]):
                    e._fail(Episode(spec), "hint_leak")
                else:
                    ep = e._start(spec, res[0])
                    ep.worker = res[1]
                    if ep.context_tokens + 1 > e.cfg.max_episode_tokens:  # the first prompt fills the budget
                        ep.truncated = True
                        e._finish(ep, "max_episode_tokens")
                        ep = None
                self._settle(env_id)
                if ep is None:
                    e.progress(e.stats)
                return ep

    def _call(self, env_id: str, fn: Any, ep: Episode) -> Any:
        """``fn(worker, ep)`` on the env's live worker (opened or replaced as needed); an
        ``EnvError`` is returned, and a worker it killed is dropped. Caller holds the env lock."""
        e = self.e
        with self.env_clock.running():
            try:
                return fn(e._worker(env_id), ep)
            except e.EnvError as exc:
                e._note_dead(env_id)
                return exc

    # -- quarantine (callers hold the env lock and the engine lock) ----------------------------
    def _settle(self, env_id: str) -> None:
        """Record a freshly quarantined env and close its worker, as lockstep's _quarantine does."""
        e = self.e
        if env_id in e.bad and env_id not in e.stats.quarantined:
            e.stats.quarantined.append(env_id)
            e._drop_worker(env_id)

    def _quarantined(self, ep: Episode) -> bool:
        e, env_id = self.e, ep.spec.env_id
        if env_id not in e.bad:
            return False
        self._settle(env_id)
        e._finish(ep, "quarantined", e.bad[env_id])
        e.progress(e.stats)
        return True
