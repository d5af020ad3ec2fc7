"""Curriculum signals: what an environment is worth to the Designer, and which old ones to replay.

Pure functions over plain numbers, so every formula can be checked by hand (tests/test_regret.py
does). `stages/regret.py` feeds them the streamed rollout returns and the environment memory.

- ``regret_stats``: hint-regret ``mean(hinted) - mean(unhinted)`` with a 95% confidence half-width.
  When every pair index has exactly one hinted and one unhinted episode the interval comes from the
  paired differences ``d_i = hinted_i - unhinted_i`` (same env seed, so the env's own variance
  cancels): ``t(0.975, n-1) * sd(d) / sqrt(n)``. Otherwise (a shard missing, an episode dropped) it
  falls back to Welch's unpaired interval ``t(0.975, min(n_h, n_u) - 1) * sqrt(s_h²/n_h + s_u²/n_u)``,
  with the conservative degrees of freedom instead of Welch–Satterthwaite.
- ``ema_lp``: learning progress as in Kanitscheider et al. 2021 (arXiv:2106.14876; the form of
  Syllabus' ``LearningProgressCurriculum``) over an env's per-iteration unhinted success rates
  p_1..p_T: ``fast <- a*p + (1-a)*fast``, ``slow <- a*fast + (1-a)*slow`` (a = 0.1), then
  ``LP = |rw(fast) - rw(slow)|`` with Syllabus' reweighting ``rw(p) = p(1-t) / (p + t(1-2p))``,
  t = 0.1 (its code calls it "the reweighting function from the paper"). Both EMAs start at the
  env's first observation p_1, so a single observation has LP 0 and a constant history (always
  solved, never solved) stays at 0: only a change in success scores. Syllabus starts both at 0,
  which for envs that appear at different iterations would score an env by how well it is already
  solved (histories [1] and [1, 1] above a real progress [0, 1]).
- ``learnability``: ``p(1-p)`` (Syllabus/SFL), p the unhinted success rate.
- ``cell_stats``: the same statistics over a cell of spec designs (``--pool-cells``), their
  episodes pooled, so each design of a cell is paid the cell's regret.
- ``replay_priorities``: PLR (Jiang et al. 2021; minimax ``plr.py``) over past envs:
  ``P = (1-rho) * P_S + rho * P_C`` with ``P_S(i) ∝ (1/rank_i)^(1/beta)`` on the score (positive
  regret) and ``P_C(i) = staleness_i / sum(staleness)``; ``select_replay`` applies it to memory rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spade_cli.core.records import Validation, to_row

EMA_ALPHA = 0.1
LP_THETA = 0.1

# Student t 0.975 quantiles for 1..30 degrees of freedom; beyond, a Cornish-Fisher correction of
# the normal quantile is within 0.001 of the exact value.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964


def t975(df: int) -> float:
    """Two-sided 95% Student t quantile."""
    if df < 1:
        raise ValueError("a t quantile needs at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def quantile(vals: list[float], p: float) -> float:
    """The p-quantile of sorted, non-empty ``vals``, interpolated linearly (numpy's default)."""
    k = (len(vals) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def sample_var(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def regret_stats(hinted: dict[int, list[float]], unhinted: dict[int, list[float]]) -> dict:
    """Means, counts, regret and its 95% CI from returns grouped by pair index.

    Returns ``{hinted_mean, unhinted_mean, hinted_n, unhinted_n, regret, regret_ci95, paired}``;
    means, regret and CI are None where they are undefined (no episodes, or n < 2 for the CI).
    """
    h = [r for rs in hinted.values() for r in rs]
    u = [r for rs in unhinted.values() for r in rs]
    out = {"hinted_mean": mean(h), "unhinted_mean": mean(u), "hinted_n": len(h), "unhinted_n": len(u),
           "regret": None, "regret_ci95": None, "paired": False}
    if not h or not u:
        return out
    out["regret"] = out["hinted_mean"] - out["unhinted_mean"]
    complete = (hinted.keys() == unhinted.keys()
                and all(len(hinted[k]) == 1 and len(unhinted[k]) == 1 for k in hinted))
    if complete:
        out["paired"] = True
        diffs = [hinted[k][0] - unhinted[k][0] for k in sorted(hinted)]
        if len(diffs) >= 2:
            out["regret_ci95"] = t975(len(diffs) - 1) * math.sqrt(sample_var(diffs) / len(diffs))
    elif len(h) >= 2 and len(u) >= 2:
        se = math.sqrt(sample_var(h) / len(h) + sample_var(u) / len(u))
        out["regret_ci95"] = t975(min(len(h), len(u)) - 1) * se
    return out


def success_rate(returns: Sequence[float], threshold: float) -> float | None:
    """Share of episodes whose return reaches ``threshold`` (the env contract: 1 means solved)."""
    return sum(r >= threshold for r in returns) / len(returns) if returns else None


def env_stats(st: dict | None, threshold: float) -> dict:
    """``regret_stats`` plus success rates and error counts from one env's streamed episodes
    (``{"h": {pair: [returns]}, "u": {...}, "h_err": int, "u_err": int}``, or None for none)."""
    st = st or {"h": {}, "u": {}, "h_err": 0, "u_err": 0}
    out = regret_stats(st["h"], st["u"])
    out["unhinted_success"] = success_rate([r for rs in st["u"].values() for r in rs], threshold)
    out["hinted_success"] = success_rate([r for rs in st["h"].values() for r in rs], threshold)
    out["hinted_errors"], out["unhinted_errors"] = st["h_err"], st["u_err"]
    return out


def rollout_error_audit(stats: dict, max_error_rate: float) -> dict | None:
    """The ``rollout_errors`` audit of one env's ``env_stats``: its figures when the failed share of
    all its hinted + unhinted episodes exceeds ``max_error_rate``, else None."""
    n = stats["hinted_n"] + stats["unhinted_n"]
    failed = stats["hinted_errors"] + stats["unhinted_errors"]
    if not n or failed / n <= max_error_rate:
        return None
    return {"audit": "rollout_errors", "episodes": n, "failed": failed,
            "hinted_failed": stats["hinted_errors"], "unhinted_failed": stats["unhinted_errors"],
            "error_rate": failed / n, "max_error_rate": max_error_rate}


def learnability(p: float) -> float:
    return p * (1.0 - p)


def _reweight(p: float, theta: float = LP_THETA) -> float:
    """Syllabus' reweighting: stretches differences near 0 and 1 where progress is slow to show."""
    return p * (1.0 - theta) / (p + theta * (1.0 - 2.0 * p))


def ema_lp(successes: Sequence[float], alpha: float = EMA_ALPHA, theta: float = LP_THETA) -> float:
    """Learning progress after the success rates of an env's iterations, oldest first; 0 for one
    observation (both EMAs start there) or none."""
    if not successes:
        return 0.0
    fast = slow = float(successes[0])
    for p in successes[1:]:
        fast = alpha * p + (1.0 - alpha) * fast
        slow = alpha * fast + (1.0 - alpha) * slow
    return abs(_reweight(fast, theta) - _reweight(slow, theta))


def designer_reward(signal: str, stats: dict, clip_negative: bool = False) -> float | None:
    """The reward of one valid env under ``signal``; None when its rollouts cannot define it.

    ``stats`` holds ``regret``, ``unhinted_success`` and, for ema_lp, ``success_history`` (the
    env's unhinted success per iteration, this one included, oldest first).
    """
    if signal == "regret":
        r = stats.get("regret")
        if r is None:
            return None
        return max(r, 0.0) if clip_negative else r
    if signal == "learnability":
        p = stats.get("unhinted_success")
        return None if p is None else learnability(p)
    if signal == "ema_lp":
        hist = stats.get("success_history") or []
        return ema_lp(hist) if hist else None
    raise ValueError(f"unknown signal {signal!r}; choose regret, ema_lp or learnability")


SIGNALS = ("regret", "ema_lp", "learnability")


def spec_of(rec: Validation | dict) -> dict | None:
    """The structured spec a design carries (a mapping with ``rule`` and the difficulty ``level``),
    as a record field or an extra one; None for a free-form design or a malformed spec."""
    spec = rec.get("spec") if isinstance(rec, dict) else (getattr(rec, "spec", None) or rec.extra.get("spec"))
    return spec if isinstance(spec, dict) else None


def cell_stats(cells: dict[str, tuple], per_env: dict[str, dict], threshold: float) -> dict[str, dict]:
    """``env_stats`` of each env's cell: the episodes of every env with the same key, pooled.

    ``cells`` maps an env to its cell key (e.g. its spec's rule and level). Pairs stay apart per env
    (keyed ``(env, pair)``), so a cell whose envs are all fully paired keeps the paired interval.
    One design's regret at k = 4 pairs has an interval of about +-0.3; paying each design its cell's
    pooled regret trades that noise for the assumption that designs of one cell are worth the same.
    """
    groups: dict[tuple, list[str]] = {}
    for env, key in cells.items():
        groups.setdefault(key, []).append(env)
    out: dict[str, dict] = {}
    for envs in groups.values():
        st: dict = {"h": {}, "u": {}, "h_err": 0, "u_err": 0}
        for env in envs:
            one = per_env.get(env) or {}
            for side in ("h", "u"):
                st[side].update({(env, pair): rs for pair, rs in one.get(side, {}).items()})
                st[f"{side}_err"] += one.get(f"{side}_err", 0)
        pooled = {**env_stats(st, threshold), "cell_envs": len(envs)}
        out.update(dict.fromkeys(envs, pooled))
    return out


def cell_key(rec: Validation | dict, fields: Sequence[str]) -> tuple | None:
    """The values of ``fields`` in a design's spec; None for a free-form design or a spec lacking one."""
    spec = spec_of(rec) or {}
    return tuple(repr(spec[f]) for f in fields) if spec and all(f in spec for f in fields) else None


def level_of(rec: Validation | dict) -> int | None:
    """A spec's difficulty ``level`` (higher is harder); None without one."""
    level = (spec_of(rec) or {}).get("level")
    return level if isinstance(level, int) and not isinstance(level, bool) else None


def replay_priorities(scores: Sequence[float], staleness: Sequence[float], beta: float = 0.1,
                      rho: float = 0.1) -> list[float]:
    """PLR replay distribution over candidates: rank prioritisation of ``scores`` mixed with staleness.

    Ranks are 1 for the highest score; ties keep input order, so callers sort candidates by a stable
    key first. When every staleness is 0 the staleness term is dropped rather than dividing by 0.
    """
    n = len(scores)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: -scores[i])
    rank = [0] * n
    for r, i in enumerate(order, 1):
        rank[i] = r
    w = [(1.0 / rank[i]) ** (1.0 / beta) for i in range(n)]
    ps = [x / sum(w) for x in w]
    total_age = sum(staleness)
    if total_age <= 0:
        return ps
    return [(1.0 - rho) * ps[i] + rho * staleness[i] / total_age for i in range(n)]


def select_replay(memory: list[dict], iteration: int, k: int, exclude: set[str], beta: float, rho: float,
                  ) -> list[dict]:
    """The K memory envs with the highest PLR probability, as validation rows for iteration + 1.

    Score = positive regret of the env's latest history entry; staleness = iterations since it was
    last played, counted from the next iteration. Envs without stored code cannot be replayed.
    """
    cands = sorted((r for r in memory if r.get("code") and r["env_id"] not in exclude and r["history"]
                    and not r.get("flags")), key=lambda r: r["env_id"])  # a flagged env is never replayed
    scores, stale = [], []
    for r in cands:
        last = r["history"][-1]
        scores.append(max(last.get("regret") or 0.0, 0.0))
        stale.append(float(iteration + 1 - last.get("iteration", iteration)))
    prio = replay_priorities(scores, stale, beta=beta, rho=rho)
    order = sorted(range(len(cands)), key=lambda i: (-prio[i], cands[i]["env_id"]))[:k]
    out = []
    for i in order:
        r = cands[i]
        spec = {"spec": r["spec"]} if spec_of(r) else {}  # a spec design stays one when replayed
        rec = Validation(env_id=r["env_id"], iteration=iteration + 1, title=r.get("title"), code=r["code"],
                         hint=r.get("hint"), doc={"id": r.get("doc_id")} if r.get("doc_id") else None,
                         valid=True, extra={"replay": {"priority": prio[i], "score": scores[i],
                                                       "staleness": stale[i],
                                                       "first_iteration": r.get("first_iteration")}, **spec})
        out.append(to_row(rec))
    return out
