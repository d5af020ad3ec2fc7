"""`spade eval` on the paper's suites: BFCL v4 multi-turn from bfcl-eval's packaged data and
checker, Reasoning Gym categories. Offline; a suite whose package is absent is skipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spade_cli.backends.fake import FakeBackend
from spade_cli.evaluators import EvalContext, parse_spec, rg_items
from tests.conftest import run_spade

_KEYWORD_CALL = re.compile(r"^\w+\((\s*\w+\s*=.*)?\)$", re.S)


def _bfcl():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (recipes/setup.sh installs it --no-deps)")
    pytest.importorskip("tree_sitter", reason="bfcl-eval's decoder needs tree_sitter (pip install 'spade[bfcl]')")
    from bfcl_eval import utils

    return utils


def _replay(truth: list[list[str]]) -> list[str]:
    """What a perfect prompting model writes: each turn's calls as one list, then a plain reply."""
    out = []
    for turn in truth:
        if turn:
            out.append("[" + ", ".join(turn) + "]")
        out.append("Done.")
    return out


@pytest.mark.integration
def test_bfcl_ground_truth_replayed_through_spades_handler_scores_one() -> None:
    utils = _bfcl()
    from spade_cli.backends import Sampling
    from spade_cli.eval_bfcl import play_entry

    entries = utils.load_dataset_entry("multi_turn_base")
    truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry("multi_turn_base")}
    # BFCL's prompting decoder reads keyword arguments only, so a ground truth written with a
    # positional one (``sort('a.txt')``) would not survive being sent as text: replay the others.
    keyword_only = [e for e in entries if all(_KEYWORD_CALL.match(c) for turn in truths[e["id"]] for c in turn)][:2]
    assert len(keyword_only) == 2
    for entry in keyword_only:
        truth = truths[entry["id"]]
        log = play_entry(FakeBackend("gt", outputs=_replay(truth)), Sampling(max_tokens=4096), entry, truth,
                         "multi_turn_base", run_name="spade_gt", seed=0)
        assert log["valid"], log["verdict"]
        assert len(log["result"]) == len(truth)
        # The checker is live: the same replay without the last turn's calls fails on that turn.
        broken = _replay(truth[:-1]) + ["Done."]
        bad = play_entry(FakeBackend("gt", outputs=broken), Sampling(max_tokens=4096), entry, truth,
                         "multi_turn_base", run_name="spade_gt", seed=0)
        assert not bad["valid"] and bad["verdict"]["error_type"].startswith("multi_turn:")


@pytest.mark.integration
def test_bfcl_multi_turn_base_end_to_end_with_the_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    _bfcl()
    out = tmp_path / "eval.jsonl"
    proc = run_spade("eval", "--model", tiny_model, "--tasks", "bfcl:multi_turn_base:2", "--out", out,
                     "--max-tokens", "4", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1  # BFCL's step prints kept off stdout
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["task"], row["metric"], row["n"], row["harness"]) == ("bfcl:multi_turn_base", "accuracy", 2,
                                                                        "bfcl-eval")
    items = [json.loads(line) for line in Path(f"{out}.bfcl/multi_turn_base_2.jsonl").read_text().splitlines()]
    assert [i["id"] for i in items] == ["multi_turn_base_0", "multi_turn_base_1"]
    for item in items:  # a random model's text: BFCL's checker names why each entry failed
        assert item["valid"] is False and item["verdict"]["error_type"].startswith("multi_turn:")
    assert row["value"] == sum(i["valid"] for i in items) / 2
    assert not list(tmp_path.glob("result")) and not list(tmp_path.glob(".file_locks"))


@pytest.mark.unit
def test_bfcl_category_names() -> None:
    from spade_cli.eval_bfcl import MULTI_TURN, categories

    assert categories("multi_turn") == list(MULTI_TURN) and categories("base") == ["multi_turn_base"]
    assert parse_spec("bfcl:multi_turn_miss_func:5").n == 5
    with pytest.raises(Exception, match="multi-turn"):
        categories("simple_python")


@pytest.mark.integration
def test_rg_category_aggregates_its_datasets_by_reasoning_gyms_category(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    from spade_cli.evaluators import rg_datasets, run_rg

    spec = parse_spec("rg:category:logic:14")
    names = rg_datasets(spec.name)
    # Exactly the datasets reasoning-gym itself files under logic (ProceduralDataset.category).
    assert names == sorted(n for n in DATASETS if n != "composite"
                           and reasoning_gym.create_dataset(n, size=1, seed=0).category == "logic")
    items, skipped = rg_items(spec, 14, seed=0)
    assert not skipped and len(items) == 14
    # Right answers for the first dataset's items, wrong for every other one.
    first = names[0]
    outputs = [f"<answer>{item['answer']}</answer>" if ds == first else "<answer>zzz</answer>"
               for ds, item, _ in items]
    ctx = EvalContext(model="fake", out=tmp_path / "e.jsonl", batch_size=4)
    ctx._backend = FakeBackend("fake", outputs=outputs)
    [row] = run_rg(spec, ctx)
    per = row.extra["per_dataset"]
    assert set(per) == set(names) and per[first] == 1.0
    assert all(v < 1.0 for ds, v in per.items() if ds != first)  # some scorers give "zzz" a little credit
    counts = {ds: sum(d == ds for d, _, _ in items) for ds in names}
    assert row.value == pytest.approx(sum(counts[ds] * per[ds] for ds in names) / 14)
    assert parse_spec("rg:category:math").name == "category:math" and "basic_arithmetic" in rg_datasets("category:math")
