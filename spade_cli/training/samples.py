"""`spade update`'s inputs: stored rows -> training samples with advantages and sampling parameters.

Agent samples are episodes (``spade.rollout/1``) grouped by ``(env_id, hinted)``, rewarded by their
``return``; Designer samples are designs with tokens grouped by ``group_id``, rewarded by their
score row's ``designer_reward`` (see ``stages/update.py`` for the rules). This module also finds how
each sample was drawn, because the trainer must score it at the same temperature and the sampler
correction is only sound for full-distribution sampling or for stored log-probs that say what the
sampler did:

- a design row records ``gen: {temperature, top_p, top_k, logprobs, ...}`` and a rollout row its
  ``sampling`` field (the same fields), so a merged or copied file still says how each row was
  drawn; ``logprobs`` is the log-prob mode (``processed``: the sampler's; ``raw``: the untempered
  model's; ``none``);
- rows written before rows carried it fall back to their file's manifest ``config``
  (``temperature``, ``top_p``, ``top_k``), their log-probs taken as the sampler's;
- otherwise the role's ``--*-temperature`` (or ``--temperature``) is assumed, top-p 1.

The samples of one GRPO group must share their sampling (temperature, top-p, top-k, log-prob
mode): a group mixing two runs is refused, naming both rows. Raw log-probs are the sampler's only
at temperature 1 without top-p/top-k; otherwise the row is refused, as is a row whose stored
log-probs contradict its mode.

Credit (``agent_credit``): by default every agent token of an episode gets the episode's advantage
(the paper's GRPO). With ``turn`` each reply is credited with its own discounted reward-to-go
``G_t = sum_{j>=t} turn_gamma**(j-t) * r_j`` (the per-turn rewards a rollout row records), compared
with the same turn of the other episodes of its group: rewards earned before a reply are not
credited to it, and with ``turn_gamma`` 0 only its own reward is. Replies are located by
``tokens.reply_ends`` (or the turn spans of ``think_context: drop``). A turn position whose
replies all earned the same has no signal; its tokens are left out of the loss, as zero-spread
groups are.

A sample's temperature is what it records; a role flag that disagrees with a row is refused. A
sample drawn with top-p < 1 or top-k > 0 is trained only with the sampler correction on (its stored
log-probs are renormalised over the nucleus, and the correction weight ``pi / q`` restricts the
gradient to the nucleus); without the correction, or without stored log-probs, it is refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_cli.core.artifacts import InputError, read_rows
from spade_cli.core.records import Design, Rollout, Score
from spade_cli.training.config import UpdateConfig

if TYPE_CHECKING:
    from spade_cli.training.grpo import Sample


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _tokens(path: Path, line: int, tokens: dict, need_env_mask: bool) -> tuple[list, list, list, list | None]:
    """Checked (prompt_ids, completion_ids, mask, logprobs) of a row; a malformed field names the row."""
    p, c = tokens.get("prompt_ids"), tokens.get("completion_ids")
    if not _ids(p) or not _ids(c) or not p or not c:
        raise InputError(path, line, "tokens.prompt_ids/completion_ids must be non-empty lists of ints")
    mask = tokens.get("env_mask") if need_env_mask else [1] * len(c)
    if not isinstance(mask, list) or len(mask) != len(c) or any(m not in (0, 1) for m in mask):
        raise InputError(path, line, "tokens.env_mask must be a list of 0/1 as long as completion_ids")
    lps = tokens.get("logprobs")
    if lps is not None:
        if not isinstance(lps, list) or len(lps) != len(c):
            raise InputError(path, line, "tokens.logprobs must be as long as completion_ids")
    # A text-mode server (`transformers serve`) returns no log-probs, so an episode records None at
    # every agent token: no sampler log-probs at all, as for a null field (the samples train on-policy).
    if lps is not None and all(lp is None for m, lp in zip(mask, lps, strict=True) if m):
        lps = None
    if lps is not None:
        for m, lp in zip(mask, lps, strict=True):
            if m and not (isinstance(lp, int | float) and math.isfinite(lp)):
                raise InputError(path, line, "tokens.logprobs must be finite numbers at agent tokens")
        lps = [float(lp) if m else 0.0 for m, lp in zip(mask, lps, strict=True)]
    return p, c, mask, lps


def _sequences(path: Path, line: int, tokens: dict) -> list[tuple[list, list, list, list | None, int]]:
    """The training sequences of an episode, each with its offset in ``completion_ids``. One, the
    whole token stream, when the context kept earlier reasoning; with ``think_context: drop`` one
    per turn: the prompt as the model saw it that turn (rebuilt from ``turns[i].prefix``/``ids``,
    each relative to the turn before) and that turn's sampled tokens with their mask."""
    p, c, mask, lps = _tokens(path, line, tokens, need_env_mask=True)
    if tokens.get("think_context") != "drop":
        return [(p, c, mask, lps, 0)]
    turns = tokens.get("turns")
    if not isinstance(turns, list):
        raise InputError(path, line, "tokens.think_context is drop but tokens.turns is not a list")
    out, prev, end = [], p, 0
    for i, t in enumerate(turns):
        ok = isinstance(t, dict) and _ids(t.get("ids")) and all(
            isinstance(t.get(k), int) and not isinstance(t.get(k), bool) for k in ("prefix", "start", "end"))
        if not ok or not (0 <= t["prefix"] <= len(prev) and end <= t["start"] <= t["end"] <= len(c)):
            raise InputError(path, line, f"tokens.turns[{i}] must be {{prefix, ids, start, end}} within "
                                         "the previous prompt and completion_ids, in order")
        prompt = prev[:t["prefix"]] + t["ids"]
        s, e = t["start"], t["end"]
        if any(mask[s:e]):
            out.append((prompt, c[s:e], mask[s:e], lps[s:e] if lps is not None else None, s))
        prev, end = prompt, e
    if sum(sum(m) for _, _, m, _, _ in out) != sum(mask):
        raise InputError(path, line, "tokens.turns do not cover every agent token of completion_ids")
    return out


def _reply_of_token(path: Path, line: int, tokens: dict, mask: list[int]) -> tuple[list[int], int]:
    """The index of the reply each completion token belongs to (env tokens: the next reply's), and
    the number of replies."""
    ends = tokens.get("reply_ends")
    if ends is None and tokens.get("think_context") == "drop" and isinstance(tokens.get("turns"), list):
        ends = [t.get("end") if isinstance(t, dict) else None for t in tokens["turns"]]
    if ends is None:
        raise InputError(path, line, "--agent-credit turn needs tokens.reply_ends, which spade rollout "
                                     "records since per-turn credit exists; roll out again or train with "
                                     "--agent-credit episode")
    n = len(mask)
    # Two equal ends are an empty reply (the context budget left no room for it).
    if not _ids(ends) or any(b < a for a, b in zip(ends, ends[1:], strict=False)) or (ends and ends[-1] > n):
        raise InputError(path, line, "tokens.reply_ends must be non-decreasing ints within completion_ids")
    if any(mask[ends[-1] if ends else 0:]):
        raise InputError(path, line, "tokens.reply_ends do not cover every agent token of completion_ids")
    out, j = [], 0
    for i in range(n):
        while j < len(ends) and i >= ends[j]:
            j += 1
        out.append(j)
    return out, len(ends)


def _turn_rewards(path: Path, line: int, turns: list) -> list[float]:
    """The per-turn rewards of a row, checked: turn credit trains on each of them."""
    out = []
    for i, t in enumerate(turns):
        r = t.get("reward") if isinstance(t, dict) else None
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise InputError(path, line, f"turns[{i}].reward must be a finite number (--agent-credit turn)")
        out.append(float(r))
    return out


def _turn_returns(rewards: list[float], replies: int, gamma: float) -> list[float]:
    """Discounted reward-to-go of each reply; a reply that was never stepped earned 0."""
    r = (list(rewards) + [0.0] * replies)[:replies]
    out, acc = [0.0] * replies, 0.0
    for t in range(replies - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


class SamplingParams:
    """How rows were drawn: the row's own record, else its file's manifest (cached per file)."""

    def __init__(self) -> None:
        self._manifests: dict[Path, dict] = {}

    def _manifest(self, path: Path) -> dict:
        if path not in self._manifests:
            try:
                self._manifests[path] = json.loads(Path(f"{path}.manifest.json").read_text()).get("config") or {}
            except (OSError, ValueError):
                self._manifests[path] = {}
        return self._manifests[path]

    def of(self, path: Path, record: dict | None) -> dict:
        src = record if isinstance(record, dict) and "temperature" in record else self._manifest(path)
        return {k: src.get(k) for k in ("temperature", "top_p", "top_k", "logprobs")}


class GroupSampling:
    """The sampling of each GRPO group's first row: a later row of the group must match it."""

    def __init__(self) -> None:
        self._first: dict[tuple, tuple[Path, int, dict]] = {}

    def check(self, group: tuple, path: Path, line: int, params: dict) -> None:
        first = self._first.setdefault(group, (path, line, params))
        if first[2] != params:
            diff = ", ".join(f"{k} {first[2].get(k)!r} there, {params.get(k)!r} here" for k in params
                             if params.get(k) != first[2].get(k))
            raise InputError(path, line, f"sampled unlike {first[0]}:{first[1]} of the same group ({diff}); "
                                         "a group's samples must come from one sampler: two runs are mixed")


def _resolve(cfg: UpdateConfig, role: str, path: Path, line: int, params: dict, has_logprobs: bool) -> float:
    """The sample's temperature; refuses what the trainer cannot score faithfully."""
    flag = getattr(cfg, f"{role}_temperature")
    recorded = params.get("temperature")
    if recorded is not None:
        if not isinstance(recorded, int | float) or recorded <= 0:
            raise InputError(path, line, f"sampled at temperature {recorded!r}: greedy or malformed samples "
                                         "have no sampling distribution to train on")
        if flag is not None and not math.isclose(flag, recorded):
            raise InputError(path, line, f"sampled at temperature {recorded:g} but --{role}-temperature is "
                                         f"{flag:g}; the trainer must score samples at their own temperature")
    temperature = float(recorded if recorded is not None else flag if flag is not None else cfg.temperature)
    top_p, top_k = params.get("top_p"), params.get("top_k")
    truncated = (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0)
    mode = params.get("logprobs")
    if mode not in (None, "processed", "raw", "none"):
        raise InputError(path, line, f"unknown log-prob mode {mode!r} (processed, raw or none)")
    if mode == "none" and has_logprobs:
        raise InputError(path, line, "the row says it was sampled without log-probs (logprobs: none) but "
                                     "stores tokens.logprobs; the row is inconsistent")
    if mode == "raw" and has_logprobs and (truncated or not math.isclose(temperature, 1.0)):
        raise InputError(path, line, f"the stored log-probs are raw (the untempered model's), not the "
                                     f"sampler's at temperature {temperature:g}, top-p {top_p}, top-k {top_k}; "
                                     "resample from a server with processed log-probs (spade serve, or vllm "
                                     "serve --logprobs-mode processed_logprobs)")
    if truncated and (not cfg.tis or not has_logprobs):
        why = "the sampler correction is off" if not cfg.tis else "the row has no sampler log-probs"
        raise InputError(path, line, f"sampled with top-p {top_p} / top-k {top_k}, and {why}: the trainer's "
                                     "full-distribution log-probs are another policy. Train with the sampler "
                                     "correction on (--tis, the default) on rows with "
                                     "log-probs, or sample with --top-p 1")
    return temperature


def collect_samples(cfg: UpdateConfig) -> tuple[list[Sample], dict]:
    """Read the artifacts into samples with advantages; returns (kept samples, per-role counts)."""
    import torch

    from spade_cli.training import grpo
    from spade_cli.training.grpo import Sample

    counts: dict[str, dict[str, int]] = {"agent": {}, "designer": {}}

    def bump(role: str, key: str) -> None:
        counts[role][key] = counts[role].get(key, 0) + 1

    # A score row names its design by (group_id, sample) when regret copied them (one row per
    # design, invalid ones included); env_id alone is ambiguous for parse failures and duplicates.
    rewards: dict[str, float] = {}
    slot_rewards: dict[tuple, float] = {}
    broken: set[str] = set()  # envs whose score says too many episodes failed: they teach nothing
    for path, line, rec in read_rows(cfg.scores, "spade.score"):
        assert isinstance(rec, Score)
        if not math.isfinite(rec.designer_reward):  # one NaN turns every weight of the update into NaN
            raise InputError(path, line, f"field 'designer_reward' must be a finite number, got "
                                         f"{rec.designer_reward!r}")
        if "rollout_errors" in (rec.extra.get("flags") or []):
            broken.add(rec.env_id)
        rewards.setdefault(rec.env_id, float(rec.designer_reward))
        if rec.extra.get("group_id") is not None:
            slot_rewards[(rec.extra["group_id"], rec.extra.get("sample"))] = float(rec.designer_reward)

    sampling = SamplingParams()
    groups = GroupSampling()
    samples: list[Sample] = []
    # One entry per Agent episode: its reward and its samples (one, or one per turn when the
    # context dropped earlier reasoning). Advantages are computed over episodes, not sequences,
    # so an episode weighs the same in its group whatever its number of turns.
    # With turn credit an entry also has each reply's reward-to-go and, per sample, the reply of
    # each of its tokens.
    episodes: list[tuple[tuple, float, list[Sample], tuple | None]] = []
    # Where each unit (episode, design) was read: a non-finite advantage names its row.
    origins: dict[str, list[tuple[Path, int]]] = {"agent": [], "designer": []}
    turn_credit = cfg.agent_credit == "turn"
    want = {"unhinted": (False,), "hinted": (True,), "both": (False, True)}[cfg.agent_episodes]
    # A role with share 0 is left out entirely, not multiplied by 0: its tokens would still enter
    # the plan, the normalisers and the shared gradient clip, so the other role's step would differ
    # from a run without it (the fixed-pool baselines rely on that identity).
    use_rollouts = bool(cfg.rollouts) and cfg.designer_share != 1.0
    use_designs = bool(cfg.envs) and cfg.designer_share != 0.0
    seen: dict[str, tuple] = {}  # episode_id -> where and what: a repeat trains once, as regret counts it
    for path, line, rec in read_rows(cfg.rollouts, "spade.rollout") if use_rollouts else []:
        assert isinstance(rec, Rollout)
        key = (rec.env_id, rec.hinted, rec.pair, rec.return_, rec.error)
        first = seen.setdefault(rec.episode_id, (path, line, key))
        if first[:2] != (path, line):
            if first[2] != key:
                raise InputError(path, line, f"episode {rec.episode_id!r} is also at {first[0]}:{first[1]} "
                                 "with other values; two runs are mixed, keep one of them")
            bump("agent", "skipped_duplicate")
            continue
        if rec.hinted not in want:
            continue
        bump("agent", "episodes")
        if rec.env_id in broken:
            bump("agent", "dropped_rollout_errors")
            continue
        group = ("agent", rec.env_id, rec.hinted)
        failed = rec.error is not None
        # A failed episode is return 0 over the tokens the agent generated before the failure, as
        # regret scores it: crashing the env can never pay more than playing it badly.
        reward = 0.0 if failed else float(rec.return_)
        tokens = rec.tokens or {}
        has_agent_tokens = any(m == 1 for m in (tokens.get("env_mask") or []))
        if not tokens.get("completion_ids") or (failed and not has_agent_tokens):
            if failed:  # no sample, but still a 0 in its group's statistics
                bump("agent", "failed_no_tokens")
                episodes.append((group, reward, [], ([0.0], []) if turn_credit else None))
                origins["agent"].append((path, line))
            else:
                bump("agent", "skipped_no_tokens")
            continue
        params = sampling.of(path, rec.extra.get("sampling") or rec.extra.get("gen"))
        groups.check(group, path, line, params)
        mine = []
        seqs = _sequences(path, line, tokens)
        for p, c, mask, lps, _ in seqs:
            temp = _resolve(cfg, "agent", path, line, params, lps is not None)
            mine.append(Sample("agent", group, reward, p, c, mask, lps, temperature=temp))
        credit = None
        if turn_credit:
            reply, replies = _reply_of_token(path, line, tokens, tokens["env_mask"])
            rewards_t = [] if failed else _turn_rewards(path, line, rec.turns)
            credit = (_turn_returns(rewards_t, replies, cfg.turn_gamma),
                      [reply[start:start + len(c)] for _, c, _, _, start in seqs])
        if failed:
            bump("agent", "failed_reward0")
        episodes.append((group, reward, mine, credit))
        origins["agent"].append((path, line))

    for path, line, rec in read_rows(cfg.envs, ("spade.validation", "spade.design")) if use_designs else []:
        assert isinstance(rec, Design)
        bump("designer", "designs")
        if not rec.tokens:
            bump("designer", "skipped_no_tokens")
            continue
        invalid = rec.code is None or getattr(rec, "valid", True) is False
        if invalid:
            bump("designer", "invalid")
        slot = (rec.group_id, rec.sample)
        if slot in slot_rewards:
            reward = slot_rewards[slot]
        elif invalid:
            reward = cfg.invalid_reward
        elif rec.env_id in rewards:
            reward = rewards[rec.env_id]
        else:
            bump("designer", "skipped_unscored")
            continue
        # A design with two-phase reasoning masks the tokens spade appended (a forced </think>).
        p, c, mask, lps = _tokens(path, line, rec.tokens, need_env_mask="env_mask" in rec.tokens)
        params = sampling.of(path, rec.gen)
        temp = _resolve(cfg, "designer", path, line, params, lps is not None)
        group = ("designer", rec.group_id if rec.group_id is not None else f"{path}:{line}")
        groups.check(group, path, line, params)
        samples.append(Sample("designer", group, reward, p, c, mask, lps, temperature=temp))
        origins["designer"].append((path, line))

    kept: list[Sample] = []
    units = {"agent": [u[:3] for u in episodes],
             "designer": [(s.group, s.reward, [s]) for s in samples if s.role == "designer"]}
    for role in ("agent", "designer"):
        mine = units[role]
        if not mine:
            continue
        adv, keep = grpo.group_advantages(torch.tensor([r for _, r, _ in mine]), [g for g, _, _ in mine],
                                          cfg.scale_rewards)
        _check_finite(adv.tolist(), origins[role], "advantage")
        groups = {g for g, _, _ in mine}
        live = {g for (g, _, _), k in zip(mine, keep.tolist(), strict=True) if k}
        counts[role].update(samples=sum(len(u[2]) for u in mine), groups=len(groups),
                            zero_spread_groups=len(groups - live))
        if role == "agent" and turn_credit:
            kept += _credit_turns(episodes, cfg.scale_rewards, counts[role], origins[role])
            continue
        for (_, _, seqs), a, k in zip(mine, adv.tolist(), keep.tolist(), strict=True):
            for s in seqs if k else []:
                s.advantage = a
                kept.append(s)
    for role, given, used in (("agent", cfg.rollouts, use_rollouts), ("designer", cfg.envs, use_designs)):
        if given and not used:
            counts[role]["left_out"] = "share 0"
    return kept, counts


def _check_finite(values: list[float], origins: list[tuple[Path, int]], what: str) -> None:
    """Refuse a non-finite advantage (finite rewards whose spread overflows float32), naming its row."""
    for v, (path, line) in zip(values, origins, strict=True):
        if not math.isfinite(v):
            raise InputError(path, line, f"the {what} computed from this row's reward is {v!r}: the rewards "
                                         "of its group are too large to train on")


def _credit_turns(episodes: list, scale: str, counts: dict, origins: list[tuple[Path, int]]) -> list[Sample]:
    """Per-token advantages from each reply's reward-to-go, baselined by the same turn of the other
    episodes of its group; the tokens of a turn position without spread leave the loss."""
    import torch

    from spade_cli.training import grpo

    labels, values, where = [], [], []
    for e, (group, _, _, (returns, _)) in enumerate(episodes):
        for t, g in enumerate(returns):
            labels.append((group, t))
            values.append(g)
            where.append((e, t))
    adv, keep = grpo.group_advantages(torch.tensor(values), labels, scale)
    _check_finite(adv.tolist(), [origins[e] for e, _ in where], "turn advantage")
    credit = {w: (a, k) for w, a, k in zip(where, adv.tolist(), keep.tolist(), strict=True)}
    live_labels = {lb for lb, k in zip(labels, keep.tolist(), strict=True) if k}
    counts.update(turn_positions=len(set(labels)), zero_spread_turn_positions=len(set(labels) - live_labels))
    kept = []
    for e, (_, _, seqs, (_, replies)) in enumerate(episodes):
        for s, reply in zip(seqs, replies, strict=True):
            live = [credit.get((e, t), (0.0, False)) for t in reply]
            s.mask = [m if k else 0 for m, (_, k) in zip(s.mask, live, strict=True)]
            s.token_advantages = [a if m else 0.0 for m, (a, _) in zip(s.mask, live, strict=True)]
            trained = [a for m, a in zip(s.mask, s.token_advantages, strict=True) if m]
            if trained:  # its mean, for update.json's advantage summary
                s.advantage = sum(trained) / len(trained)
                kept.append(s)
    return kept
