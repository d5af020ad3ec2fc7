"""Two of `spade validate`'s checks that play extra episodes: ``trivial`` confirmed on more seeds,
and ``answer_table`` (a hint that is an answer table keyed by what the observation shows).

``trivial``: one lucky episode is not a trivial env. A guessing game over 1-100 with eight tries
is hit by random text on one seed in eleven; keyed by the file, that seed is the same on every
rerun, so the same learnable file was rejected every time. A degenerate policy that reaches
``trivial_return`` on its contract seed is played on ``CONFIRM`` more seeds and rejects the design
only when it reaches it on at least ``CONFIRM_NEEDED`` of them (the first two misses stop it).

``answer_table`` (reason ``hint_is_answer``): per seed, the lookup policy plays what the hint holds
for the key the observation shows (``spade_cli/checks/keyed.py``): one episode whose replies move down the
candidate list after each miss, or, for an env that ends after one step, one episode per candidate.
If it solves at least ``TABLE_NEEDED`` of the four contract seeds, the hint holds the answers. That
alone is also true of a good env whose hint teaches a table the env itself teaches (the starter
envs correct a wrong answer: "No, the opposite of hot is cold."), so the check then asks whether a
miss teaches the player anything: at the turn that paid the lookup most, two wrong replies of one
length are played instead. The miss is informative when the episode goes on and the observation
after it names the answer, or differs between the two replies (with each reply's own text masked,
so an echo is not feedback). Only when no tested seed's miss is informative is the design
rejected. Cost: nothing when no observation of the contract episodes shows a key of the hint;
else at most four lookup episodes (``MAX_CANDIDATES`` per seed for a one-step env), two misses
per tested seed, and the first two lost seeds stop it.

    easy = confirm_trivial(design, pool, {"random": 1.0}, factories, seeds, max_steps=16, threshold=0.8)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from spade_cli.checks.keyed import MAX_CANDIDATES, Table, words
from spade_cli.sandbox import EnvError
from spade_cli.sandbox.play import play

CONFIRM = 3          # more seeds for a degenerate policy that hit
CONFIRM_NEEDED = 2   # of them it must also solve
TABLE_NEEDED = 3     # of the four contract seeds the lookup must solve
MISS_SEEDS = 2       # solved seeds whose miss is tested
MISSES = ("zqxj", "vkwp")  # two wrong replies of one length


def confirm_trivial(design, pool, hits: dict[str, float], factories: dict[str, Callable[[int], Callable]],
                    seeds: Callable[[int], int], *, max_steps: int, threshold: float) -> dict[str, str]:
    """Per degenerate policy that hit on its contract seed: how many more seeds it solves; those
    that reach ``CONFIRM_NEEDED`` are returned (name -> "k of n seeds")."""
    if not hits:
        return {}
    out: dict[str, str] = {}
    worker = None
    try:
        for p, name in enumerate(sorted(hits)):
            won = lost = 0
            for i in range(CONFIRM):
                if worker is None or not worker.alive:
                    worker = pool.open(design.code, design.env_id, hash_seed=0)
                s = seeds(20 + CONFIRM * p + i)
                won += play(worker, f"{name}:confirm{i}", s, factories[name](s), max_steps)["return"] >= threshold
                lost = i + 1 - won
                if won >= CONFIRM_NEEDED or lost > CONFIRM - CONFIRM_NEEDED:
                    break
            if won >= CONFIRM_NEEDED:
                out[name] = f"{won + 1} of {won + lost + 1} seeds"
    finally:
        if worker is not None:
            worker.close()
    return out


def _episode(worker, name: str, seed: int, choose: Callable[[str, float | None], str], max_steps: int,
             ) -> tuple[float, list[tuple[str, str, float, bool]]]:
    obs, _ = worker.reset(name, seed)
    turns: list[tuple[str, str, float, bool]] = []
    total, last = 0.0, None
    try:
        for _ in range(max_steps):
            action = choose(obs, last)
            obs, last, term, trunc, _ = worker.step(name, action)
            total += last
            turns.append((action, obs, last, term or trunc))
            if term or trunc:
                break
    finally:
        worker.close_episode(name)
    return total, turns


class _Lookup:
    """Reply with the hint's entry for the key in view; after a miss on the same key, the next one."""

    def __init__(self, table: Table) -> None:
        self.table, self.cands, self.i = table, [], 0

    def __call__(self, obs: str, last: float | None) -> str:
        cands = self.table.candidates(obs)
        if cands and (cands != self.cands or (last or 0) > 0):
            self.cands, self.i = cands, 0
        elif self.cands:
            self.i += 1
        return self.cands[self.i % len(self.cands)] if self.cands else "a"


def _masked(obs: str, reply: str) -> str:
    return re.sub(re.escape(reply), "\0", obs, flags=re.I)


def _script(replies: list[str]) -> Callable[[str, float | None], str]:
    it = iter(replies)
    return lambda obs, last: next(it, replies[-1])


def _miss_informative(worker, tag: str, seed: int, prefix: list[str], answer: str, paid: float) -> bool:
    """Does a wrong reply at the turn that paid the lookup most teach the player anything?"""
    seen = []
    for n, wrong in enumerate(MISSES):
        script = [*prefix, wrong]
        _, turns = _episode(worker, f"{tag}:miss{n}", seed, _script(script), len(script))
        if len(turns) < len(script):  # the env ended inside the prefix: nothing to compare
            return True
        _action, obs, reward, done = turns[-1]
        if reward >= paid:  # a filler reply scores as much there: not a lookup (a token 0.01 is no escape)
            return True
        if done:
            return False
        if answer.lower() in obs.lower():
            return True
        seen.append(_masked(obs, wrong))
    return seen[0] != seen[1]


def _solve(worker, tag: str, seed: int, table: Table, single_shot: bool, first_obs: str, max_steps: int,
           threshold: float) -> tuple[int, list[str] | None, str, float]:
    """(episodes played, the replies before the turn that paid most first or None, that turn's
    reply, its reward)."""
    if single_shot:
        cands = table.candidates(first_obs)[:MAX_CANDIDATES]
        for n, c in enumerate(cands):
            ret, _ = _episode(worker, f"{tag}:{n}", seed, _script([c]), 1)
            if ret >= threshold:
                return n + 1, [], c, ret
        return len(cands), None, "", 0.0
    ret, turns = _episode(worker, tag, seed, _Lookup(table), max_steps)
    if ret < threshold:
        return 1, None, "", 0.0
    best = max(t[2] for t in turns)
    j = next(i for i, t in enumerate(turns) if t[2] == best)
    return 1, [t[0] for t in turns[:j]], turns[j][0], best


def answer_table(design, pool, ch, stats: dict, contract: dict[int, list[str]], *, single_shot: bool,
                 max_steps: int, threshold: float) -> None:
    """The ``answer_table`` check (reason ``hint_is_answer``); ``contract``: seed -> the
    observations of that seed's contract episode."""
    t0 = time.perf_counter()
    if not Table(design.hint or "").usable:  # one entry, no list: nothing to look up
        ch.add("answer_table", True, "the hint is not a table", t0)
        return
    # The key is what the seed draws: words every seed shows are the frame. The screen drops any
    # word all four contract episodes showed (error messages, "Unknown command; use ..."); the
    # lookup drops only those of every first observation, so a key that happened to come up in
    # every episode is still read when it comes up again.
    shown = {s: [set(words(o)) for o in obs] for s, obs in contract.items() if obs}  # one pass over the text
    firsts, seen = [ws[0] for ws in shown.values()], [set().union(*ws) for ws in shown.values()]
    table = Table(design.hint or "", set.intersection(*firsts) if len(firsts) > 1 else set())
    screen = Table(design.hint or "", set.intersection(*seen) if len(seen) > 1 else set())
    keyed = [s for s, ws in shown.items() if any(screen.candidates(w) for w in ws)]
    if not keyed:
        ch.add("answer_table", True, "no observation shows a key of the hint", t0)
        return
    played = won = 0
    solved: list[tuple[int, list[str], str, float]] = []
    worker = None
    try:
        for n, seed in enumerate(contract):
            if n - won > len(contract) - TABLE_NEEDED:
                break
            if worker is None or not worker.alive:
                worker = pool.open(design.code, design.env_id, hash_seed=0)
            k, prefix, answer, paid = _solve(worker, f"table{n}", seed, table, single_shot, contract[seed][0],
                                       max_steps, threshold)
            played += k
            if prefix is not None:
                won += 1
                solved.append((seed, prefix, answer, paid))
        informative = None
        if won >= TABLE_NEEDED:
            informative = any(_miss_informative(worker, f"miss{i}", seed, prefix, answer, paid)
                              for i, (seed, prefix, answer, paid) in enumerate(solved[:MISS_SEEDS]))
            played += 2 * min(len(solved), MISS_SEEDS)
    except EnvError as err:  # the contract says any text is a valid action; these are text too
        ch.add("answer_table", False, f"{err.reason}: {err.detail}", t0, err.reason)
        return
    finally:
        if worker is not None:
            worker.close()
    stats.setdefault("probes", {})["answer_table"] = {"episodes": played, "seeds_solved": won,
                                                      "seeds": len(contract), "miss_informative": informative}
    hack = won >= TABLE_NEEDED and not informative
    detail = (f"the hint's entries for the keys the observation shows solve {won} of {len(contract)} seeds"
              + (", and a miss teaches nothing" if hack else ", but a miss teaches the answer"
                 if informative else ""))
    ch.add("answer_table", not hack, detail, t0, "hint_is_answer")
