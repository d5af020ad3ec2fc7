"""Pure pieces of `spade design`: parsing completions, the memory summary, corpus loading and
reproducible document selection, pool selection, and the prompt plan."""

from __future__ import annotations

import json

import pytest

from spade_cli.core.artifacts import InputError, SpadeError
from spade_cli.core.records import Memory
from spade_cli.designer import corpus, prompts
from spade_cli.envs import pool
from stages import design

CODE = "import gymnasium as gym\n\nclass E(gym.Env):\n    def step(self, action):\n        return '', 0.0, True, False, {}\n"


# -- parsing -------------------------------------------------------------------------------------

@pytest.mark.unit
def test_parse_the_requested_format():
    text = f"Title: Vault\n```python\n{CODE}```\nHint: The code is the year.\n"
    p = prompts.parse_completion(text)
    assert (p.title, p.code, p.hint, p.error) == ("Vault", CODE, "The code is the year.", None)


@pytest.mark.unit
@pytest.mark.parametrize("text, title, hint", [
    # a thinking block that itself contains a decoy fence, then a markdown heading
    (f"<think>maybe ```python\nx=1\n``` no</think>\n# Vault\n```python\n{CODE}```\nHint: year", "Vault", "year"),
    # the template opened <think> in the prompt: only the closing tag is in the completion
    (f"planning...</think>Title: **Vault**\n```py\n{CODE}```\n**Hint:** year\n", "Vault", "year"),
    # a bare fence and a fenced hint block
    (f"Name: Vault\n```\n{CODE}```\n```hint\nyear\n```", "Vault", "year"),
    # the hint comes first; the code fence is never closed
    (f"Title: Vault\nHint: year\n\n```python\n{CODE}", "Vault", "year"),
    # no title at all
    (f"```python\n{CODE}```\nhint: year", None, "year"),
])
def test_parse_tolerates_sloppy_shapes(text, title, hint):
    p = prompts.parse_completion(text)
    assert p.error is None, p.error
    assert (p.title, p.hint) == (title, hint)
    assert p.code.strip() == CODE.strip()


@pytest.mark.unit
def test_multiline_hint_stops_at_the_next_section():
    text = f"Title: T\n```python\n{CODE}```\nHint: first line\nsecond line\n\nNotes: not part of it\n"
    assert prompts.parse_completion(text).hint == "first line\nsecond line"


@pytest.mark.unit
@pytest.mark.parametrize("text, error", [
    ("", "empty completion"),
    ("just some words", "no fenced python block and no hint section"),
    ("Title: T\nHint: h", "no fenced python block"),
    (f"Title: T\n```python\n{CODE}```\n", "no hint section"),
    ("<think>```python\nclass X: pass\n```\nHint: h</think>", "no fenced python block and no hint section"),
])
def test_parse_failures_say_why_and_null_code_and_hint(text, error):
    p = prompts.parse_completion(text)
    assert (p.code, p.hint, p.error) == (None, None, error)


# -- memory summary ------------------------------------------------------------------------------

def mem(env_id, it, unhinted, hinted, title=None):
    hist = [] if unhinted is None else [{"iteration": it, "unhinted_mean": unhinted, "hinted_mean": hinted,
                                         "regret": round(hinted - unhinted, 6)}]
    return Memory(env_id=env_id, title=title or env_id, hint=f"hint of {env_id}", first_iteration=it,
                  history=hist)


@pytest.mark.unit
@pytest.mark.parametrize("u, h, want", [
    (0.9, 1.0, "too easy"), (0.05, 0.1, "too hard"), (0.1, 0.7, "learnable"), (0.4, 0.5, "no signal"),
    (None, None, "untested"),
])
def test_labels(u, h, want):
    assert prompts.label(u, h, None if u is None else h - u) == want


@pytest.mark.unit
def test_memory_summary_counts_all_and_lists_the_most_recent_k():
    memory = [mem("easy", 0, 0.9, 1.0), mem("hard", 1, 0.0, 0.1), mem("learn", 2, 0.1, 0.8),
              mem("new", 3, None, None), mem("old", 0, 0.5, 0.5)]
    text = prompts.memory_summary(memory, k=3)
    lines = text.splitlines()
    assert "5 environments so far" in lines[0]
    for part in ("1 too easy", "1 too hard", "1 learnable", "1 untested", "1 no signal"):
        assert part in lines[0]
    listed = lines[1:-1]
    assert [ln.split("]")[1].split("(")[0].strip() for ln in listed] == ["new", "learn", "hard"]
    assert listed[1] == ("- [learnable] learn (iteration 2): unhinted 0.10, hinted 0.80, regret 0.70. "
                         "Hint was: hint of learn")
    assert prompts.memory_summary([]) is None


@pytest.mark.unit
def test_memory_uses_the_latest_history_entry():
    m = Memory(env_id="x", title="X", history=[
        {"iteration": 0, "unhinted_mean": 0.0, "hinted_mean": 0.9, "regret": 0.9},
        {"iteration": 4, "unhinted_mean": 0.95, "hinted_mean": 1.0, "regret": 0.05}])
    assert "[too easy] X (iteration 4)" in prompts.memory_summary([m])


@pytest.mark.unit
def test_memory_shows_the_progress_of_an_env_measured_again():
    """A replayed env's line shows its first unhinted mean beside the latest; one measured once does not."""
    again = Memory(env_id="x", title="X", hint="h", history=[
        {"iteration": 1, "unhinted_mean": None, "hinted_mean": 0.5, "regret": None},
        {"iteration": 2, "unhinted_mean": 0.1, "hinted_mean": 0.9, "regret": 0.8},
        {"iteration": 5, "unhinted_mean": 0.6, "hinted_mean": 0.9, "regret": 0.3}])
    once = Memory(env_id="y", title="Y", hint="h", history=[
        {"iteration": 5, "unhinted_mean": 0.3, "hinted_mean": 0.9, "regret": 0.6}])
    lines = prompts.memory_summary([again, once]).splitlines()
    assert lines[1] == ("- [learnable] Y (iteration 5): unhinted 0.30, hinted 0.90, regret 0.60. Hint was: h")
    assert lines[2] == ("- [learnable] X (iteration 5): unhinted 0.60 (from 0.10 at iteration 2), hinted 0.90, "
                        "regret 0.30. Hint was: h")


# -- corpus --------------------------------------------------------------------------------------

@pytest.mark.unit
def test_bundled_corpus_is_a_few_dozen_distinct_documents():
    docs = corpus.load_corpus(None)
    assert 40 <= len(docs) <= 80
    assert len({d["id"] for d in docs}) == len(docs)
    assert len({d["id"].split("/")[0] for d in docs}) >= 10  # many domains


@pytest.mark.unit
def test_selection_is_reproducible_order_independent_and_seed_sensitive():
    docs = corpus.load_corpus(None)
    a = [d["id"] for d in corpus.select_docs(docs, 6, seed=0, iteration=0)]
    assert a == [d["id"] for d in corpus.select_docs(list(reversed(docs)), 6, seed=0, iteration=0)]
    assert len(set(a)) == 6
    assert a != [d["id"] for d in corpus.select_docs(docs, 6, seed=1, iteration=0)]
    assert a != [d["id"] for d in corpus.select_docs(docs, 6, seed=0, iteration=1)]
    # an unrelated document added to the corpus changes a pick only if it wins that pick
    extra = {"id": "zz-new", "source": "x", "text": "new"}
    b = [d["id"] for d in corpus.select_docs(docs + [extra], 6, seed=0, iteration=0)]
    assert all(x == y or y == "zz-new" for x, y in zip(a, b, strict=True))


@pytest.mark.unit
def test_small_corpus_repeats_documents_rather_than_failing():
    docs = [{"id": "a", "source": "s", "text": "t"}]
    assert [d["id"] for d in corpus.select_docs(docs, 3, 0, 0)] == ["a", "a", "a"]


@pytest.mark.unit
def test_excerpt_is_bounded_reproducible_and_marked():
    text = " ".join(f"Sentence number {i} is here." for i in range(400))
    a = corpus.excerpt(text, 300, key="k1")
    assert a == corpus.excerpt(text, 300, key="k1")
    assert len(a) <= 302 and (a.startswith("…") or a.endswith("…"))
    assert corpus.excerpt("short text", 300, key="k") == "short text"
    assert {corpus.excerpt(text, 300, key=f"k{i}") for i in range(5)} != {a}


@pytest.mark.unit
def test_local_corpus_formats(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"content": "alpha text", "url": "u1"}\n{"text": "beta"}\n')
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "one.txt").write_text("gamma paragraph")
    (folder / "sub").mkdir()
    (folder / "sub" / "two.txt").write_text("delta paragraph")
    jl = corpus.load_corpus(tmp_path / "a.jsonl")
    assert jl[0] == {"id": "u1", "source": "a", "text": "alpha text"}
    assert jl[1]["id"].startswith("sha256:")
    assert {d["id"] for d in corpus.load_corpus(folder)} == {"one.txt", "sub/two.txt"}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["x", "y"]}), tmp_path / "c.parquet")
    assert [d["id"] for d in corpus.load_corpus(tmp_path / "c.parquet")] == ["p1", "p2"]


@pytest.mark.unit
def test_bad_corpus_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: .*text field"):
        corpus.load_corpus(bad)
    with pytest.raises(InputError, match="no such corpus file"):
        corpus.load_corpus(tmp_path / "missing.jsonl")


@pytest.mark.unit
def test_hub_corpus_offline_fails_naming_the_dataset():
    # the session fixture sets HF_DATASETS_OFFLINE=1 and an empty cache
    with pytest.raises(SpadeError, match="'someone/web-corpus'.*Offline, pass local"):
        corpus.load_corpus("someone/web-corpus")


# -- pools and the prompt plan --------------------------------------------------------------------

@pytest.mark.unit
def test_pool_pick_is_distinct_order_independent_and_dealt_to_n():
    envs = pool.load_folder(pool.BUNDLED_POOL)
    a = [e["name"] for e in pool.pick(envs, 5, seed=0, iteration=0)]
    assert a == [e["name"] for e in pool.pick(envs[::-1], 5, seed=0, iteration=0)]
    assert len(set(a)) == 5
    assert a != [e["name"] for e in pool.pick(envs, 5, seed=0, iteration=1)]
    # a smaller pool is dealt in passes to exactly n (the equal-budget rule of #16)
    assert len(pool.pick(envs, 100, 0, 0)) == 100


@pytest.mark.unit
def test_pool_folder_needs_hint_sidecars(tmp_path):
    (tmp_path / "x.py").write_text('"""X env"""\n')
    with pytest.raises(InputError, match="no hint sidecar x.hint"):
        pool.load_folder(tmp_path)


@pytest.mark.unit
def test_plan_same_seed_same_prompts_other_seed_other_docs(tmp_path):
    m = tmp_path / "memory.jsonl"
    m.write_text(json.dumps({"schema": "spade.memory/1", "env_id": "e1", "title": "Old vault",
                             "history": [{"iteration": 0, "unhinted_mean": 0.1, "hinted_mean": 0.9,
                                          "regret": 0.8}]}) + "\n")
    kw = dict(n=24, group=4, iteration=2, corpus=None, grounding=True, memory=m, excerpt_chars=400)
    a = design.plan_prompts(seed=0, **kw)
    assert a == design.plan_prompts(seed=0, **kw)
    b = design.plan_prompts(seed=1, **kw)
    assert len(a) == 6 and len({p["group_id"] for p in a}) == 6
    assert [p["doc"]["id"] for p in a] != [p["doc"]["id"] for p in b]
    user = a[0]["messages"][1]["content"]
    assert a[0]["doc"]["text"] in user and "[learnable] Old vault" in user
    assert "Title: Ledger reconciliation" in user  # the worked example
    plain = design.plan_prompts(seed=0, **{**kw, "grounding": False, "memory": None})
    assert all(p["doc"] is None for p in plain)
    assert "<document>" not in plain[0]["messages"][1]["content"]
    assert "Environment memory" not in plain[0]["messages"][1]["content"]


@pytest.mark.unit
def test_worked_example_round_trips_through_the_parser():
    ex = design.worked_example()
    p = prompts.parse_completion(prompts.format_answer(ex["title"], ex["code"], ex["hint"]))
    assert (p.title, p.code, p.hint, p.error) == (ex["title"], ex["code"], ex["hint"], None)


# -- the core with a scripted backend (the tiny model only writes garbage, so this is where a
#    well-formed completion travels through run() into a parsed row) ---------------------------------

@pytest.mark.unit
def test_run_parses_good_completions_and_keeps_bad_ones(tmp_path):
    from spade_cli.backends.fake import FakeBackend
    from spade_cli.core.records import env_id_for

    ex = design.worked_example()
    good = "<think>let me plan</think>\n" + prompts.format_answer("Ledger", ex["code"], ex["hint"])
    be = FakeBackend("scripted", outputs=[good, "no idea"])
    out = tmp_path / "d.jsonl"
    summary = design.run(out, model="scripted", n=4, group=2, backend=be, max_tokens=100000, seed=3)
    assert (summary["rows"], summary["backend_calls"], summary["parse_errors"]) == (4, 1, 2)
    assert be.calls == 1 and be.requests[0][1] == 2 and len(be.requests[0][0]) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    parsed = [r for r in rows if r["parse_error"] is None]
    assert len(parsed) == 2
    for r in parsed:
        assert (r["title"], r["code"], r["hint"]) == ("Ledger", ex["code"], ex["hint"])
        assert r["env_id"] == env_id_for(ex["code"], ex["hint"])
        assert r["gen"]["backend"] == "fake"
    # one seed per group (prompt), shared by its samples, so groups sample independently of each other
    seeds = {}
    for r in rows:
        seeds.setdefault(r["group_id"], set()).add(r["gen"]["seed"])
    assert len(seeds) == 2 and all(len(v) == 1 for v in seeds.values()) and len(set.union(*seeds.values())) == 2
    assert be.requests[0][2].seed is None
    bad = [r for r in rows if r["parse_error"]]
    assert all(r["completion"] == "no idea" and r["code"] is None for r in bad)
    # finished: the next call is a no-op, and a changed config is refused
    assert design.run(out, model="scripted", n=4, group=2, backend=be, max_tokens=100000, seed=3)["status"] \
        == "up to date"
    with pytest.raises(SpadeError, match="seed 3 -> 4"):
        design.run(out, model="scripted", n=4, group=2, backend=be, max_tokens=100000, seed=4)


@pytest.mark.unit
def test_resume_keeps_complete_groups_and_drops_a_torn_one(tmp_path):
    from spade_cli.backends.fake import FakeBackend
    from spade_cli.core.artifacts import Stage

    out = tmp_path / "d.jsonl"
    be = FakeBackend("scripted", outputs=["x"])
    kw = dict(model="scripted", n=6, group=2, backend=be, max_tokens=64, chunk=1)
    # reproduce the crashed run's partial file: group 0 complete, group 1 half-written
    design.run(out, **kw)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    config = json.loads((tmp_path / "d.jsonl.manifest.json").read_text())["config"]
    stage = Stage.begin("design", out, config, {"corpus": [corpus.BUNDLED]})
    out.unlink()
    (tmp_path / "d.jsonl.manifest.json").unlink()
    stage.partial.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    be2 = FakeBackend("scripted", outputs=["y"])
    summary = design.run(out, **{**kw, "backend": be2})
    assert summary["resumed_rows"] == 2 and be2.calls == 2 and summary["rows"] == 6
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert again[:2] == rows[:2] and [r["completion"] for r in again[2:]] == ["y"] * 4


@pytest.mark.unit
def test_missing_inputs_are_named(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl: no such memory file"):
        design.run(tmp_path / "d.jsonl", model="m", n=4, memory=tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="no-pool: no such pool file"):
        design.run(tmp_path / "d.jsonl", pool=str(tmp_path / "no-pool"), n=4)
    with pytest.raises(SpadeError, match="cannot create the task 'nope'"):
        design.run(tmp_path / "d.jsonl", pool="rg:nope", n=1)
