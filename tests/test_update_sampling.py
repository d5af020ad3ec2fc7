"""`spade update` reads how each row was sampled from the row itself (``extra.sampling`` of an
episode, ``gen`` of a design), falls back to the file's manifest for rows written before, and
refuses rows it cannot train on faithfully, naming file and line. Only the sample collection
runs here (no optimizer step): the refusals happen before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.core.artifacts import InputError
from spade_cli.training.samples import collect_samples
from tests.test_update import _config, make_artifacts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def artifacts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("sampling_inputs"), tiny_model, envs=1, k=2)


def _rollouts(artifacts: dict, out: Path, sampling: dict | None, override: dict[int, dict] | None = None,
              manifest: dict | None = None) -> Path:
    rows = [json.loads(x) for x in artifacts["rollouts"].read_text().splitlines()]
    for i, r in enumerate(rows):
        s = (override or {}).get(i, sampling)
        if s is not None:
            r["sampling"] = s  # a row field (records keep fields they do not name in extra)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if manifest is not None:
        Path(f"{out}.manifest.json").write_text(json.dumps({"config": manifest}))
    return out


def _collect(artifacts: dict, rollouts: Path, tiny_model: Path, tmp_path: Path, **kw: object) -> dict:
    cfg = _config({**artifacts, "rollouts": rollouts}, tiny_model, tmp_path / "out", envs=[], scores=[], **kw)
    samples, _ = collect_samples(cfg)
    return {s.temperature for s in samples}


PROCESSED = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs": "processed", "backend": "vllm"}


def test_rows_win_over_their_manifest(artifacts, tiny_model, tmp_path):
    # the manifest says top-p 0.5 (refused without the correction); the rows say top-p 1: rows win
    rollouts = _rollouts(artifacts, tmp_path / "r.jsonl", PROCESSED, manifest={"temperature": 1.0, "top_p": 0.5})
    assert _collect(artifacts, rollouts, tiny_model, tmp_path, tis=False) == {1.0}
    # the same rows without their record: the manifest is read, and top-p 0.5 refused
    old = _rollouts(artifacts, tmp_path / "old.jsonl", None, manifest={"temperature": 1.0, "top_p": 0.5})
    with pytest.raises(InputError, match=r"old.jsonl:1: sampled with top-p 0.5"):
        _collect(artifacts, old, tiny_model, tmp_path, tis=False)


def test_a_group_of_two_samplers_is_refused(artifacts, tiny_model, tmp_path):
    # rows 0 and 1 are two episodes of one group (env00, unhinted): one drawn at another top-p
    mixed = _rollouts(artifacts, tmp_path / "mixed.jsonl", PROCESSED, {1: {**PROCESSED, "top_p": 0.9}})
    with pytest.raises(InputError, match=r"mixed.jsonl:2: sampled unlike .*mixed.jsonl:1 of the same group "
                                         r"\(top_p 1.0 there, 0.9 here\)"):
        _collect(artifacts, mixed, tiny_model, tmp_path)


def test_raw_or_absent_logprobs_are_checked(artifacts, tiny_model, tmp_path):
    raw = {**PROCESSED, "logprobs": "raw"}
    # at temperature 1 without truncation raw log-probs are the sampler's: trained
    ok = _rollouts(artifacts, tmp_path / "raw1.jsonl", raw)
    assert _collect(artifacts, ok, tiny_model, tmp_path) == {1.0}
    hot = _rollouts(artifacts, tmp_path / "raw07.jsonl", {**raw, "temperature": 0.7})
    with pytest.raises(InputError, match=r"raw07.jsonl:1: the stored log-probs are raw"):
        _collect(artifacts, hot, tiny_model, tmp_path)
    lying = _rollouts(artifacts, tmp_path / "none.jsonl", {**PROCESSED, "logprobs": "none"})
    with pytest.raises(InputError, match=r"none.jsonl:1: .*logprobs: none.* inconsistent"):
        _collect(artifacts, lying, tiny_model, tmp_path)
