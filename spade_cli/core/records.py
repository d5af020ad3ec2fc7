"""The records spade writes, one frozen dataclass per schema (docs/architecture.md, 'Records').

Every JSONL row carries ``"schema": "spade.<kind>/<int>"``. ``parse(row)`` turns a dict into the
record for its kind after upgrading old versions with the numbered functions in ``UPGRADES``; a
version newer than this build knows is refused, because silently reading a future format would
drop fields a later stage relies on. Fields not named here survive in ``extra`` and are written
back unchanged, so adding a field never needs a schema bump.

Rows come from files a user or another tool wrote, so they are untrusted: ``parse`` decodes the
known fields against the dataclass's annotations with msgspec (``str | None`` really is a string or
null, ``int`` is not a bool or a float) and refuses values the contract bounds, such as an
episode's return. Every refusal is a ``SchemaError`` naming the field; the reader adds file and line.

Example::

    rec = parse({"schema": "spade.design/1", "code": "...", "hint": "..."})
    rec.env_id            # computed from code and hint when the row has none
    to_row(rec)           # a plain dict again, ready for JSON
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec


class SchemaError(ValueError):
    """A row that is not a record of a known schema version."""


def env_id_for(code: str | None, hint: str | None) -> str:
    """Short content id: the same environment gets the same id in every run and shard."""
    norm = "\n".join(line.rstrip() for line in (code or "").strip().splitlines())
    payload = norm + "\x00" + " ".join((hint or "").split())
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# Marks the env_id of a design that did not parse: it names a failed sample, not an environment.
FAILED_PREFIX = "unparsed-"


def failed_design_id(group_id: str | None, sample: int, completion: str | None) -> str:
    """The env_id of a design that failed to parse: ``unparsed-`` + 12 hex of (group, sample, text).

    The content id of a design hashes its code and hint; a parse failure has neither, so every
    failure would share the id of empty content and look like one environment. The slot and the
    completion make the id distinct and deterministic (a rerun writes the same one), and the prefix
    says it is no environment: no stage plays, scores or remembers it as one.
    """
    key = f"{group_id}|{sample}|{completion or ''}"
    return FAILED_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Design:
    schema = "spade.design/1"
    env_id: str = ""
    iteration: int = 0
    group_id: str | None = None
    sample: int = 0
    doc: dict | None = None
    messages: list | None = None
    completion: str | None = None
    title: str | None = None
    code: str | None = None
    hint: str | None = None
    parse_error: str | None = None
    tokens: dict | None = None
    gen: dict | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.env_id:
            object.__setattr__(self, "env_id", env_id_for(self.code, self.hint))


@dataclass(frozen=True)
class Validation(Design):
    schema = "spade.validation/1"
    # Required: a row without a verdict must not pass for an invalid design (nor a valid one).
    valid: bool = field(kw_only=True)
    reason: str | None = None
    checks: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    schema = "spade.rollout/1"
    episode_id: str
    env_id: str
    iteration: int
    hinted: bool
    seed: int
    pair: int
    messages: list = field(default_factory=list)
    turns: list = field(default_factory=list)
    return_: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    tokens: dict | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    schema = "spade.score/1"
    env_id: str
    iteration: int
    signal: str
    hinted_mean: float | None
    unhinted_mean: float | None
    hinted_n: int
    unhinted_n: int
    regret: float | None
    regret_ci95: float | None
    designer_reward: float
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Memory:
    schema = "spade.memory/1"
    env_id: str
    title: str | None = None
    hint: str | None = None
    doc_id: str | None = None
    first_iteration: int = 0
    history: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Eval:
    schema = "spade.eval/1"
    task: str
    metric: str
    value: float | None
    stderr: float | None = None
    n: int | None = None
    model: str | None = None
    backend: str | None = None
    harness: str | None = None
    extra: dict = field(default_factory=dict)


Record = Design | Validation | Rollout | Score | Memory | Eval
KINDS: dict[str, type] = {
    cls.schema.split("/")[0]: cls for cls in (Design, Validation, Rollout, Score, Memory, Eval)
}
# Python keywords that are record fields: stored under a trailing underscore in the dataclass.
_RENAMED = {"return": "return_"}
# (kind, from_version) -> function turning a row of that version into the next one.
UPGRADES: dict[tuple[str, int], Callable[[dict], dict]] = {}


def split_schema(tag: Any) -> tuple[str, int]:
    if not isinstance(tag, str) or "/" not in tag:
        raise SchemaError(f"missing or malformed 'schema' field: {tag!r} (expected 'spade.<kind>/<int>')")
    kind, _, ver = tag.rpartition("/")
    if kind not in KINDS or not ver.isdigit():
        raise SchemaError(f"unknown schema {tag!r}; known kinds: {', '.join(sorted(KINDS))}")
    return kind, int(ver)


def current_version(kind: str) -> int:
    return int(KINDS[kind].schema.rpartition("/")[2])


def upgrade(row: dict) -> dict:
    """Bring a row to the current version of its kind, or refuse a version from the future."""
    kind, ver = split_schema(row.get("schema"))
    cur = current_version(kind)
    if ver > cur:
        raise SchemaError(
            f"schema {row['schema']!r} is newer than this spade understands ({kind}/{cur}); upgrade spade"
        )
    while ver < cur:
        step = UPGRADES.get((kind, ver))
        if step is None:
            raise SchemaError(f"no upgrade from {kind}/{ver} to {kind}/{cur}")
        row = step(row)
        ver += 1
        row["schema"] = f"{kind}/{ver}"
    return row


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}


def parse(row: dict, expect: str | tuple[str, ...] | None = None) -> Record:
    """Dict -> record. ``expect`` limits the accepted kinds (e.g. "spade.design")."""
    if not isinstance(row, dict):
        raise SchemaError(f"a record must be a JSON object, got {type(row).__name__}")
    row = upgrade(dict(row))
    kind = row["schema"].rpartition("/")[0]
    if expect is not None:
        wanted = (expect,) if isinstance(expect, str) else expect
        if kind not in wanted:
            raise SchemaError(f"expected a {' or '.join(wanted)} row, got {row['schema']!r}")
    cls = KINDS[kind]
    fields = _fields(cls)
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in row.items():
        if key == "schema":
            continue
        name = _RENAMED.get(key, key)
        (known if name in fields else extra)[name if name in fields else key] = value
    missing = [
        n for n, f in fields.items()
        if n not in known and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SchemaError(f"{row['schema']} row lacks required field(s): {', '.join(missing)}")
    try:
        rec = msgspec.convert({**known, "extra": extra}, cls)
    except msgspec.ValidationError as exc:
        raise SchemaError(field_message(str(exc), known)) from None
    bad = _out_of_bounds(rec)
    if bad:
        raise SchemaError(bad)
    return rec


# msgspec's names for JSON types -> the words of our messages.
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "object": "an object", "array": "a list", "null": "null"}
_MSGSPEC_ERROR = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)` - at `\$\.(?P<path>[^`]+)`")


def field_message(msg: str, known: dict[str, Any]) -> str:
    """'Expected `str | null`, got `int` - at `$.code`' -> "field 'code' must be a string or null,
    got 123": the field as the row spells it, the value as the user wrote it."""
    m = _MSGSPEC_ERROR.fullmatch(msg)
    if not m:
        return msg
    name = m["path"].split(".")[0].split("[")[0]
    key = {v: k for k, v in _RENAMED.items()}.get(name, name)
    want = " or ".join(_TYPE_WORDS.get(t, t) for t in m["want"].split(" | "))
    got = reprlib.repr(known[name]) if name in known else _TYPE_WORDS.get(m["got"], m["got"])
    return f"field {key!r} must be {want}, got {got}"


# The env contract bounds an episode's return to [0, 1] (docs/architecture.md, 'The environment contract'), with the 1e-6 slack for float
# sums that validation and the episode engine allow. An episode that ended in an env error records
# rollout's --error-return instead, which rollout bounds to ERROR_RETURN_RANGE.
RETURN_SLACK = 1e-6
ERROR_RETURN_RANGE = (-1.0, 1.0)


def return_problem(ret: float, error: str | None) -> str | None:
    """Why an episode return breaks the contract, or None. Shared with regret's fast scan."""
    lo, hi = ERROR_RETURN_RANGE if error is not None else (-RETURN_SLACK, 1 + RETURN_SLACK)
    if lo <= ret <= hi:  # False for NaN as well
        return None
    if error is not None:
        return (f"field 'return' must lie in [{lo:g}, {hi:g}] for an episode that ended in an error "
                f"(rollout's --error-return), got {ret!r}")
    return f"field 'return' must lie in [0, 1] (the env contract), got {ret!r}"


class _TokenIds(msgspec.Struct):
    """The two arrays every ``tokens`` object holds; its other keys are checked where they are used."""

    prompt_ids: list[int]
    completion_ids: list[int]


def tokens_problem(tokens: dict | None) -> str | None:
    """Why a row's ``tokens`` object is malformed, or None. Decoded by msgspec (C speed, so a row of
    thousands of ids costs little): a row without ``completion_ids`` must not pass for an episode or
    design that produced no tokens, which a trainer would silently leave out."""
    if not tokens:  # null or {}: no tokens at all, e.g. an episode that failed before its first reply
        return None
    missing = [f"'tokens.{k}'" for k in _TokenIds.__struct_fields__ if k not in tokens]
    if missing:
        return (f"field {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: a tokens "
                "object holds prompt_ids and completion_ids (lists of token ids)")
    try:
        msgspec.convert(tokens, _TokenIds)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        m = _MSGSPEC_ERROR.fullmatch(msg)
        if m:
            name = m["path"].split(".")[0].split("[")[0]
            return f"field 'tokens.{name}' must be a list of integers, got {reprlib.repr(tokens.get(name))}"
        return f"field 'tokens': {msg}"
    return None


def _out_of_bounds(rec: Record) -> str | None:
    if isinstance(rec, Rollout):
        return return_problem(rec.return_, rec.error) or tokens_problem(rec.tokens)
    if isinstance(rec, Design):
        return tokens_problem(rec.tokens)
    return None


def to_row(rec: Record) -> dict:
    """Record -> JSON-ready dict: schema first, then fields, then the extras it was read with."""
    out: dict[str, Any] = {"schema": rec.schema}
    inverse = {v: k for k, v in _RENAMED.items()}
    for name in _fields(type(rec)):
        out[inverse.get(name, name)] = getattr(rec, name)
    for key, value in rec.extra.items():
        out.setdefault(key, value)
    return out


def validation_from(design: Design, **fields: Any) -> Validation:
    """A validation row carries every design field plus the verdict."""
    base = {f: getattr(design, f) for f in _fields(Design)}
    return Validation(**base, extra=dict(design.extra), **fields)
