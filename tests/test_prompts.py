"""The Designer prompt says what the active signal rewards (and, for regret, exactly what it said)."""

from __future__ import annotations

import pytest

from spade_cli.designer import curriculum, prompts

EXAMPLE = {"title": "Ledger", "code": "class E: pass\n", "hint": "add the columns"}
REGRET_REQUEST = ("Now design a NEW environment grounded in the document. Make it different from the "
                  "example and from the environments in memory, and aim for a task the agent can learn: "
                  "solvable with the hint, not yet solved without it.")


def _request(**kw) -> str:
    return prompts.build_messages(EXAMPLE, "a doc", None, **kw)[1]["content"].rsplit("\n\n", 1)[1]


def test_regret_prompt_unchanged() -> None:
    assert _request() == REGRET_REQUEST
    assert prompts.build_messages(EXAMPLE, "a doc", "mem") == prompts.build_messages(
        EXAMPLE, "a doc", "mem", signal="regret")


@pytest.mark.parametrize("signal, words", [("ema_lp", "changes from one iteration"),
                                           ("learnability", "p(1-p)")])
def test_each_signal_has_its_own_aim(signal: str, words: str) -> None:
    text = _request(signal=signal)
    assert words in text and "solvable with the hint" not in text


def test_every_signal_of_regret_has_a_prompt() -> None:
    assert set(prompts.AIMS) == set(curriculum.SIGNALS)
    with pytest.raises(ValueError, match="bogus"):
        prompts.build_messages(EXAMPLE, None, None, signal="bogus")
