"""Every check of an env's values and outputs, in one place for everyone who makes it.

The env process checks what its env returns before it leaves the process (``check_obs``,
``check_reward``, ``check_flag``, ``check_info``); the supervisor checks the decoded frame again
with the same functions, because the env's code runs in that process and can forge any frame;
``spade validate`` and ``spade rollout`` judge episodes with ``hint_leaks`` and
``return_in_range``. The contract (docs/architecture.md, 'Sandbox') promises that every check of validation is enforced again during
rollout: sharing the implementation is how that stays true.

    check_reward(numpy.float32(0.5))     # 0.5, a plain float
    hint_leaks("Go NORTH twice", "... go north   twice ...")   # True: case and spacing ignored
"""

from __future__ import annotations

import math
import numbers

# An episode's return lies in [0, 1] (docs/architecture.md, 'The environment contract'); sums of float rewards get this much slack.
RETURN_SLACK = 1e-6
# Shorter hints ("no", "up") occur in ordinary text by chance: they are not tested for leaks.
MIN_LEAK_CHARS = 4


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # an exception whose __str__ raises
        text = type(exc).__name__
    return text[:500]


def json_safe(value: object, depth: int = 0) -> object:
    """A plain-JSON copy of ``value`` (exact builtin types only) or Rejected(info_not_json)."""
    if depth > 32:
        raise Rejected("info_not_json", "info nests deeper than 32 levels")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        if not math.isfinite(value):
            raise Rejected("info_not_json", f"info holds a non-finite float {value!r}")
        return value
    if t is list or t is tuple:
        return [json_safe(v, depth + 1) for v in value]
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise Rejected("info_not_json", f"info has a non-string key of type {type(k).__name__}")
            out[k] = json_safe(v, depth + 1)
        return out
    raise Rejected("info_not_json", f"info holds a {t.__name__}, which is not JSON")


def check_obs(obs: object, max_chars: int) -> str:
    if not isinstance(obs, str):
        raise Rejected("obs_not_str", f"observation is a {type(obs).__name__}, not str")
    obs = str.__str__(obs)  # an exact str, whatever subclass it was
    if len(obs) > max_chars:
        raise Rejected("obs_too_large", f"observation has {len(obs)} characters (cap {max_chars})")
    if not obs.isascii():  # ASCII always encodes; only other text can hold a lone surrogate
        try:
            obs.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Rejected("obs_not_str", f"observation is not encodable text: {exc.reason}") from None
    return obs


def check_reward(reward: object) -> float:
    if type(reward) is float:  # the common case, without the slower ABC check below
        if not math.isfinite(reward):
            raise Rejected("reward_not_finite", f"reward is {reward}")
        return reward
    if isinstance(reward, bool) or type(reward).__name__ == "bool_" or not isinstance(reward, numbers.Real):
        raise Rejected("reward_not_real", f"reward is a {type(reward).__name__}, not a real number")
    value = float(reward)  # a plain float: defeats subclasses with odd __eq__ or __repr__
    if not math.isfinite(value):
        raise Rejected("reward_not_finite", f"reward is {value}")
    return value


def check_flag(flag: object, name: str) -> bool:
    if type(flag) is bool:
        return flag
    if type(flag).__name__ == "bool_":  # numpy's bool, which gymnasium's own checker accepts
        return bool(flag)
    raise Rejected("flags_not_bool", f"{name} is a {type(flag).__name__}, not bool")


def check_info(info: object) -> dict:
    if type(info) is not dict:
        raise Rejected("info_not_json", f"info is a {type(info).__name__}, not dict")
    if not info:
        return {}
    return json_safe(info)  # type: ignore[return-value]


def normalize(text: str) -> str:
    """Whitespace collapsed and case folded: how text is compared for a leak."""
    return " ".join(text.split()).casefold()


def hint_leaks(hint: str | None, text: str, *, normalized_hint: str | None = None) -> bool:
    """Whether ``text`` (an observation) contains the hint, up to case and whitespace."""
    h = normalized_hint if normalized_hint is not None else normalize(hint or "")
    return len(h) >= MIN_LEAK_CHARS and h in normalize(text)


def return_in_range(ret: float) -> bool:
    return -RETURN_SLACK <= ret <= 1 + RETURN_SLACK
