"""The streaming scan of rollout files behind `spade regret`: per-env returns and file fingerprints.

Rollout rows are large (the token arrays of every episode) and there can be 100k of them, yet the
score needs five fields. Each line is hashed for the manifest and decoded in the same pass: the
``"tokens"`` object is cut out unparsed when it is a flat object of numbers (``_cut_tokens``), and a
msgspec struct (``Episode``) decodes only the fields the score reads, type-checked, at C speed. A
row the fast path refuses is read again by ``_episode``, which names the file, line and field of
the problem, so both paths accept and refuse the same rows. Returns are bounded as the records
module bounds them (``records.return_problem``); episode ids are unique (``scan_rollouts``).

    envs, fingerprints = scan_rollouts([Path("rollouts.jsonl")], known={"3f2a..."})
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from spade_cli.core.artifacts import InputError, json_line, open_input
from spade_cli.core.records import SchemaError, field_message, return_problem, upgrade


def _flat_object(buf: bytes, start: int, end: int) -> bool:
    """True when ``buf[start:end + 1]`` (from a ``{`` to the first ``}`` after it) is a complete
    object whose only strings are its keys: no nested object, no escape, every quoted run followed
    by a colon. Then no ``}`` can hide inside a string, so cutting it out leaves valid JSON with
    every other field unchanged. Only single-byte finds (memchr), so the token arrays are scanned
    at memory speed."""
    if buf.find(b"{", start + 1, end) >= 0 or buf.find(b"\\", start, end) >= 0:
        return False
    q = buf.find(b'"', start, end)
    while q >= 0:
        close = buf.find(b'"', q + 1, end)
        if close < 0:
            return False
        j = close + 1
        while j < end and buf[j] in b" \t\r\n":
            j += 1
        if j >= end or buf[j] != 58:  # ':'
            return False
        q = buf.find(b'"', j, end)
    return True


def _cut_tokens(buf: bytes, s: int = 0, e: int | None = None) -> bytes:
    """Line ``buf[s:e]`` with its ``"tokens": {...}`` value replaced by null when that value is a
    flat object of numbers (``_flat_object``); otherwise the line unchanged, for the JSON parser.
    The token arrays of a rollout are therefore not validated here (`spade update` reads them)."""
    e = len(buf) if e is None else e
    k = buf.find(b'"tokens":', s, e)
    if k < 0:
        return buf[s:e]
    start = k + 9
    while start < e and buf[start] in b" \t":
        start += 1
    if start >= e or buf[start] != 123:  # '{'
        return buf[s:e]
    end = buf.find(b"}", start, e)
    if end < 0 or not _flat_object(buf, start, end):
        return buf[s:e]
    return buf[s:start] + b"null" + buf[end + 1:e]


class Episode(msgspec.Struct):
    """The fields of a ``spade.rollout/1`` row that the score reads; msgspec skips the rest in C."""

    schema: str
    episode_id: str
    env_id: str
    hinted: bool
    pair: int
    ret: float = msgspec.field(name="return")
    error: str | None = None


def _problem(ep: Episode) -> str | None:
    """What the types cannot say: ids are non-empty, the return within the contract's bounds."""
    for name in ("episode_id", "env_id"):
        if not getattr(ep, name):
            return f"field {name!r} must be a non-empty string"
    return return_problem(ep.ret, ep.error)


def _fields(ep: Episode) -> tuple[str, str, bool, int, float, str | None]:
    return ep.episode_id, ep.env_id, ep.hinted, ep.pair, ep.ret, ep.error


def _episode(path: Path, lineno: int, raw: bytes) -> tuple[str, str, bool, int, float, str | None]:
    """The slow, exact path: any row the fast one refuses is read here and the problem named."""
    row = json_line(path, lineno, raw)
    try:
        if not isinstance(row, dict):
            raise SchemaError(f"a record must be a JSON object, got {type(row).__name__}")
        if row.get("schema") != "spade.rollout/1":
            row = upgrade(row)
            if not row["schema"].startswith("spade.rollout/"):
                raise SchemaError(f"expected a spade.rollout row, got {row['schema']!r}")
        missing = [f for f in ("episode_id", "env_id", "hinted", "pair", "return") if f not in row]
        if missing:
            raise SchemaError(f"spade.rollout/1 row lacks required field(s): {', '.join(missing)}")
        try:
            ep = msgspec.convert(row, Episode)
        except msgspec.ValidationError as exc:
            raise SchemaError(field_message(str(exc), row)) from None
        problem = _problem(ep)
        if problem:
            raise SchemaError(problem)
    except SchemaError as exc:
        raise InputError(path, lineno, str(exc)) from None
    return _fields(ep)


def _fast_decoder() -> Callable[[bytes], tuple | None] | None:
    """The same struct decoded straight from bytes (~5x faster than json.loads). It returns None for
    anything it does not accept outright; ``_episode`` then reads the row and names the exact
    problem, so both paths accept and refuse the same rows."""
    dec = msgspec.json.Decoder(Episode)

    def decode(raw: bytes) -> tuple | None:
        try:
            ep = dec.decode(raw)
        except msgspec.DecodeError:
            return None
        if ep.schema != "spade.rollout/1" or _problem(ep):
            return None
        return _fields(ep)

    return decode


def scan_rollouts(paths: Iterable[Path], known: set[str], chunk: int = 8 << 20,
                  warnings: list[str] | None = None) -> tuple[dict[str, dict], list[dict]]:
    """One streaming pass: per-env returns grouped by side and pair, plus each file's fingerprint
    (the same sha256 and row count ``artifacts.fingerprint`` gives). sha256 runs in a helper thread
    (hashlib releases the GIL), overlapping the parse of the same block. An episode of an env that
    is neither a valid env of this iteration nor in memory is a bad row.

    Episode ids are unique: counting a row twice would weigh its seed double in the mean and fake a
    pair in the interval. A repeat identical in every field read here (a shard copied or passed
    under two names) is counted once and reported in ``warnings``; a repeat that differs means two
    runs were mixed, which no rule can resolve, so it is an error naming both lines."""
    from concurrent.futures import ThreadPoolExecutor

    envs: dict[str, dict] = {}
    fps = []
    seen: dict[str, tuple[Path, int, tuple]] = {}
    repeats: list[str] = []

    fast = _fast_decoder()

    def take(path: Path, lineno: int, raw: bytes) -> None:
        if not raw.strip():
            return
        ep = fast(raw) if fast else None
        ep_id, *fields = ep or _episode(path, lineno, raw)
        env_id, hinted, pair, ret, err = fields
        first = seen.get(ep_id)
        if first is not None:
            if first[2] != tuple(fields):
                raise InputError(path, lineno, f"episode {ep_id!r} is also at {first[0]}:{first[1]} with "
                                 "other values; two runs are mixed, keep one of them")
            repeats.append(f"{path}:{lineno} repeats {first[0]}:{first[1]}")
            return
        seen[ep_id] = (path, lineno, tuple(fields))
        if env_id not in known:
            raise InputError(path, lineno, f"episode of env {env_id!r}, which is neither a valid env of "
                             "--envs or --played nor in --memory")
        st = envs.get(env_id)
        if st is None:
            st = envs[env_id] = {"h": defaultdict(list), "u": defaultdict(list), "h_err": 0, "u_err": 0}
        st["h" if hinted else "u"][pair].append(0.0 if err is not None else ret)  # a failed episode scores 0
        if err is not None:
            st["h_err" if hinted else "u_err"] += 1
        elif hinted and ret > st.get("best_ret", float("-inf")):  # where the audits find its actions
            st["best_ret"], st["best_at"] = ret, (path, lineno)

    # Two reusable buffers, filled with readinto: no fresh 8 MB allocation (and its page faults) per
    # block, and the helper thread hashes one buffer while the next is read into the other.
    bufs = [bytearray(chunk), bytearray(chunk)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        for path in paths:
            h, lineno, keep, pending, which = hashlib.sha256(), 0, b"", None, 0
            with open_input(path) as fh:
                while True:
                    buf = bufs[which]
                    if len(buf) < len(keep) + chunk:  # a line longer than a block
                        buf = bufs[which] = bytearray(len(keep) + chunk)
                    buf[:len(keep)] = keep
                    got = fh.readinto(memoryview(buf)[len(keep):])
                    if pending is not None:
                        pending.result()
                    if not got:
                        break
                    end = len(keep) + got
                    pending = pool.submit(h.update, memoryview(buf)[len(keep):end])
                    pos = 0
                    while (nl := buf.find(b"\n", pos, end)) >= 0:
                        lineno += 1
                        take(path, lineno, _cut_tokens(buf, pos, nl))
                        pos = nl + 1
                    keep, which = bytes(buf[pos:end]), 1 - which
            if keep.strip():
                take(path, lineno + 1, _cut_tokens(keep))
            fps.append({"path": str(path), "sha256": h.hexdigest(), "rows": lineno})
    if repeats and warnings is not None:
        warnings.append(f"{len(repeats)} duplicated episode row(s), identical to an earlier one, counted "
                        f"once ({repeats[0]}{', ...' if len(repeats) > 1 else ''})")
    return envs, fps
