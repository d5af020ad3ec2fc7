"""`--corpus` as a `datasets` source: local Parquet and JSONL shards streamed through the packaged
builders, the options after `?`, reproducible picks, and clear errors (all offline)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from spade_cli.core.artifacts import InputError, SpadeError
from spade_cli.designer import corpus

pytestmark = pytest.mark.integration


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _shards(tmp_path: Path, n: int = 3, per: int = 40) -> Path:
    """FineWeb-style shards: `text`, `id`, `url` and a score column."""
    d = tmp_path / "fineweb"
    d.mkdir()
    for s in range(n):
        _parquet(d / f"{s:03d}_00000.parquet",
                 [{"text": f"Document {s}-{i} about tides and harbours. " * 3, "id": f"<urn:{s}-{i}>",
                   "url": f"https://example.org/{s}/{i}", "score": 3.1} for i in range(per)])
    return d


def test_parquet_shards_stream_through_datasets_and_picks_repeat(tmp_path: Path) -> None:
    d = _shards(tmp_path)
    spec = f"parquet:{d}/*.parquet?field=text"
    docs = corpus.load_corpus(spec)
    assert len(docs) == 120 and docs[0]["id"].startswith("<urn:") and docs[0]["text"].startswith("Document")
    picks = [x["id"] for x in corpus.select_docs(docs, 6, seed=3, iteration=2)]
    assert picks == [x["id"] for x in corpus.select_docs(corpus.load_corpus(spec), 6, seed=3, iteration=2)]
    assert picks != [x["id"] for x in corpus.select_docs(docs, 6, seed=4, iteration=2)]
    # limit bounds what is read: only the first documents of the stream are candidates
    few = corpus.load_corpus(f"parquet:{d}/*.parquet?limit=10&id=url")
    assert len(few) == 10 and all(x["id"].startswith("https://example.org/0/") for x in few)


def test_jsonl_with_its_own_text_field_and_gzip(tmp_path: Path) -> None:
    rows = [{"body_text": f"Minutes of meeting {i}: the council voted on bridges.", "doc": i} for i in range(5)]
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps({**r, "doc": r["doc"] + 5}) + "\n" for r in rows))
    docs = corpus.load_corpus(f"json:{tmp_path}/*.jsonl*?field=body_text&id=doc")
    assert sorted(int(x["id"]) for x in docs) == list(range(10))
    with pytest.raises(InputError, match=r"needs a string field 'text'.*its fields: body_text, doc"):
        corpus.load_corpus(f"json:{plain}?field=text")


def test_bad_sources_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(SpadeError, match="no file matches"):
        corpus.load_corpus(f"parquet:{tmp_path}/nothing-*.parquet")
    with pytest.raises(SpadeError, match="'colour=red' is not an option"):
        corpus.load_corpus("HuggingFaceFW/fineweb-edu?colour=red")
    with pytest.raises(SpadeError, match="limit must be a positive integer"):
        corpus.load_corpus("HuggingFaceFW/fineweb-edu?limit=0")
    d = _shards(tmp_path, n=1, per=3)
    with pytest.raises(SpadeError, match="cannot stream the corpus.*split"):
        corpus.load_corpus(f"parquet:{d}/*.parquet?split=validation")
    # a hub id offline (the tests forbid downloads) names the dataset and how to go local
    with pytest.raises(SpadeError, match=r"fineweb-edu:sample-10BT\?split=train.*Offline, pass local files"):
        corpus.load_corpus("HuggingFaceFW/fineweb-edu:sample-10BT?split=train")


def test_design_prompts_are_grounded_in_a_streamed_corpus(tmp_path: Path) -> None:
    from stages.design import plan_prompts

    d = _shards(tmp_path, n=2, per=5)
    plan = plan_prompts(8, 2, seed=0, iteration=1, corpus=f"parquet:{d}/*.parquet", grounding=True,
                        memory=None, excerpt_chars=300)
    ids = [p["doc"]["id"] for p in plan]
    assert len(set(ids)) == 4 and set(ids) <= {f"<urn:{s}-{i}>" for s in range(2) for i in range(5)}
    assert all("tides and harbours" in p["doc"]["text"] for p in plan)
    prompt = plan[0]["messages"][-1]["content"]
    assert "tides and harbours" in prompt
