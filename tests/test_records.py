"""Records: schema tags, strict parsing, upgrades, round trips."""

from __future__ import annotations

import pytest

from spade_cli.core import records
from spade_cli.core.records import Design, Rollout, SchemaError, Validation, env_id_for, parse, to_row

pytestmark = pytest.mark.unit


def test_minimal_design_gets_a_content_env_id():
    rec = parse({"schema": "spade.design/1", "code": "x = 1\n", "hint": "use x"})
    assert isinstance(rec, Design)
    assert rec.env_id == env_id_for("x = 1\n", "use x")
    # Trailing whitespace and hint spacing do not change the id; the code does.
    assert env_id_for("x = 1   \n\n", "use   x") == rec.env_id
    assert env_id_for("x = 2", "use x") != rec.env_id


def test_round_trip_keeps_unknown_fields_and_the_return_key():
    row = {"schema": "spade.rollout/1", "episode_id": "e", "env_id": "a", "iteration": 3, "hinted": True,
           "seed": 7, "pair": 0, "return": 0.5, "my_field": [1, 2]}
    rec = parse(row)
    assert isinstance(rec, Rollout) and rec.return_ == 0.5 and rec.extra == {"my_field": [1, 2]}
    back = to_row(rec)
    assert back["return"] == 0.5 and "return_" not in back and back["my_field"] == [1, 2]
    assert list(back)[0] == "schema"


@pytest.mark.parametrize("row, message", [
    ({"code": "x"}, "missing or malformed 'schema'"),
    ({"schema": "spade.design"}, "missing or malformed"),
    ({"schema": "spade.nope/1"}, "unknown schema"),
    ({"schema": "spade.design/2", "code": "x"}, "newer than this spade understands"),
    ({"schema": "spade.rollout/1", "env_id": "a"}, "lacks required field(s): episode_id"),
])
def test_bad_rows_are_refused_with_a_reason(row, message):
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(row)


def test_expect_limits_the_kind():
    with pytest.raises(SchemaError, match="expected a spade.score row"):
        parse({"schema": "spade.design/1", "code": "x"}, expect="spade.score")


def test_old_versions_are_upgraded_in_order(monkeypatch):
    # Pretend the design schema is at version 3 and rows at 1 need two numbered steps.
    monkeypatch.setattr(Design, "schema", "spade.design/3")
    monkeypatch.setitem(records.UPGRADES, ("spade.design", 1), lambda r: {**r, "title": "from v1"})
    monkeypatch.setitem(records.UPGRADES, ("spade.design", 2), lambda r: {**r, "title": r["title"] + "+v2"})
    rec = parse({"schema": "spade.design/1", "code": "x"})
    assert rec.title == "from v1+v2"


def test_validation_carries_every_design_field():
    d = parse({"schema": "spade.design/1", "code": "c", "hint": "h", "title": "t", "iteration": 4, "k": 1})
    v = records.validation_from(d, valid=False, reason="syntax_error")
    assert isinstance(v, Validation)
    row = to_row(v)
    assert row["schema"] == "spade.validation/1" and row["title"] == "t" and row["iteration"] == 4
    assert row["reason"] == "syntax_error" and row["k"] == 1 and row["env_id"] == d.env_id


@pytest.mark.parametrize("row, message", [
    ({"schema": "spade.design/1", "code": 123}, "field 'code' must be a string or null, got 123"),
    ({"schema": "spade.validation/1", "code": "x", "hint": ["a"], "valid": True},
     "field 'hint' must be a string or null, got ['a']"),
    ({"schema": "spade.validation/1", "env_id": 12345, "code": "x", "valid": True},
     "field 'env_id' must be a string, got 12345"),
    ({"schema": "spade.validation/1", "code": "x", "valid": 1}, "field 'valid' must be true or false, got 1"),
    ({"schema": "spade.design/1", "iteration": 1.5}, "field 'iteration' must be an integer, got 1.5"),
    ({"schema": "spade.rollout/1", "episode_id": "e", "env_id": "a", "iteration": 0, "hinted": True, "seed": 1,
      "pair": 0, "return": "1"}, "field 'return' must be a number, got '1'"),
])
def test_fields_are_decoded_against_their_types(row, message):
    with pytest.raises(SchemaError) as exc:
        parse(row)
    assert str(exc.value) == message


def test_a_validation_row_needs_its_verdict():
    with pytest.raises(SchemaError, match=r"lacks required field\(s\): valid"):
        parse({"schema": "spade.validation/1", "code": "x", "hint": "h"})


@pytest.mark.parametrize("ret, error, ok", [
    (1.0, None, True), (0.0, None, True), (1 + 1e-7, None, True), (7.5, None, False), (-0.25, None, False),
    (float("nan"), None, False), (-0.5, "crashed", True), (-1.0, "step_timeout", True), (-2.0, "crashed", False),
])
def test_episode_return_bounds(ret, error, ok):
    row = {"schema": "spade.rollout/1", "episode_id": "e", "env_id": "a", "iteration": 0, "hinted": True,
           "seed": 1, "pair": 0, "return": ret, "error": error}
    if ok:
        assert parse(row).return_ == ret
    else:
        with pytest.raises(SchemaError, match="field 'return' must lie in"):
            parse(row)


EPISODE = {"schema": "spade.rollout/1", "episode_id": "e", "env_id": "a", "iteration": 0, "hinted": False,
           "seed": 1, "pair": 0, "return": 0.5}


@pytest.mark.parametrize("schema, extra", [("spade.rollout/1", EPISODE), ("spade.design/1", {"code": "x", "hint": "h"})])
@pytest.mark.parametrize("tokens, message", [
    ({"prompt_ids": "x"}, "field 'tokens.completion_ids' is missing"),
    ({"completion_ids": [1]}, "field 'tokens.prompt_ids' is missing"),
    ({"prompt_ids": "x", "completion_ids": [1]}, "field 'tokens.prompt_ids' must be a list of integers, got 'x'"),
    ({"prompt_ids": [1], "completion_ids": [2, True]}, "field 'tokens.completion_ids' must be a list of integers"),
    ({"prompt_ids": [1], "completion_ids": [2.0]}, "field 'tokens.completion_ids' must be a list of integers"),
    ([1, 2], "field 'tokens' must be an object or null"),
])
def test_a_tokens_object_holds_both_id_lists(schema, extra, tokens, message):
    with pytest.raises(SchemaError, match=message.replace("(", r"\(")):
        parse({**extra, "schema": schema, "tokens": tokens})


def test_tokens_may_be_null_or_hold_empty_lists_and_more_keys():
    for tokens in (None, {}, {"prompt_ids": [1], "completion_ids": [], "env_mask": [], "logprobs": None, "note": "x"}):
        assert parse({**EPISODE, "tokens": tokens}).tokens == tokens
