"""Artifact I/O: strict reading with file:line, atomic writes, manifests, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from spade_cli.core.artifacts import InputError, SpadeError, Stage, expand_inputs, read_records, write_jsonl
from spade_cli.core.records import parse

pytestmark = pytest.mark.unit

D = {"schema": "spade.design/1", "code": "x = 1", "hint": "h"}


def test_bad_json_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(D) + "\n\n" + '{"schema": "spade.design/1", "code": \n')
    with pytest.raises(InputError) as err:
        read_records(p)
    assert str(err.value).startswith(f"{p}:3: not valid JSON")


def test_rows_through_jsonlines_keep_json_s_set_and_spade_s_messages(tmp_path):
    """jsonlines splits the lines and msgspec decodes them; what msgspec refuses and json.loads
    reads (NaN, a number beyond a double) is still read, and every bad line names file and line."""
    from spade_cli.core.artifacts import read_rows

    p = tmp_path / "d.jsonl"
    p.write_bytes(b"\n".join([json.dumps(D).encode(), b"  ", json.dumps({**D, "extra_f": float("nan")}).encode(),
                              json.dumps({**D, "big": 1e400}).encode().replace(b"Infinity", b"1e400")]) + b"\n")
    got = [(n, r.extra) for _, n, r in read_rows(p, "spade.design")]
    assert [n for n, _ in got] == [1, 3, 4]  # the blank line 2 is skipped, and still counted
    assert got[1][1]["extra_f"] != got[1][1]["extra_f"] and got[2][1]["big"] == float("inf")
    for raw, message in [(b'{"schema": "spade.design/1", "code": "\xed\xa0\x80"}', "field 'code' holds a lone surrogate"),
                         (b'{"schema": "spade.design/1", "code": "\\ud800"}', "field 'code' holds a lone surrogate"),
                         (b'{"schema": "spade.design/1", "code": "\xff"}', "not valid JSON"),
                         (b"null", "a record must be a JSON object, got NoneType"),
                         (b"[1, 2", "not valid JSON")]:
        p.write_bytes(json.dumps(D).encode() + b"\n\n" + raw + b"\n")
        with pytest.raises(InputError) as err:
            read_records(p)
        assert str(err.value).startswith(f"{p}:3: {message}"), (raw, str(err.value))


def test_writes_through_jsonlines_are_spade_s_lines(tmp_path):
    """One compact line per row, non-ASCII kept, a lone surrogate written as U+FFFD."""
    from spade_cli.core.artifacts import PartialWriter

    rows = [{**D, "title": "é\ud800"}, {"schema": "spade.design/1", "code": "x = 2", "hint": "h"}]
    write_jsonl(tmp_path / "a.jsonl", rows)
    with PartialWriter(tmp_path / "b.jsonl") as w:
        for row in rows:
            w.write(row)
    for name in ("a.jsonl", "b.jsonl"):
        assert (tmp_path / name).read_text(encoding="utf-8").splitlines() == [
            '{"schema":"spade.design/1","code":"x = 1","hint":"h","title":"é\ufffd"}',
            '{"schema":"spade.design/1","code":"x = 2","hint":"h"}'], name
    write_jsonl(tmp_path / "c.jsonl", [parse(D)])
    assert read_records(tmp_path / "c.jsonl") == [parse(D)]


def test_several_files_and_globs(tmp_path):
    for i in range(3):
        write_jsonl(tmp_path / f"r.shard-{i}.jsonl", [{**D, "code": f"x = {i}"}])
    recs = read_records([str(tmp_path / "r.shard-*.jsonl"), tmp_path / "r.shard-0.jsonl"])
    assert [r.code for r in recs] == ["x = 0", "x = 1", "x = 2"]  # sorted, de-duplicated
    assert len(expand_inputs(f"{tmp_path}/r.shard-0.jsonl,{tmp_path}/r.shard-1.jsonl")) == 2
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs(str(tmp_path / "nothing-*.jsonl"))


def _stage(tmp_path, inp, **config):
    return Stage.begin("demo", tmp_path / "out.jsonl", config, {"designs": [inp]})


def test_stage_protocol_up_to_date_and_refusal(tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [D])
    st = _stage(tmp_path, inp, a=1)
    assert st.status() == "new" and st.check() is False and st.resume() == []
    with st.writer() as w:
        w.write(parse(D))
    manifest = st.commit(1, {"rows": 1})
    assert manifest["output"]["rows"] == 1 and manifest["inputs"]["designs"][0]["rows"] == 1
    assert not list(tmp_path.glob("out.jsonl.partial-*"))
    assert _stage(tmp_path, inp, a=1).check() is True  # up to date
    with pytest.raises(SpadeError, match=r"config changed: a 1 -> 2.*--force"):
        _stage(tmp_path, inp, a=2).check()
    write_jsonl(inp, [D, D])
    with pytest.raises(SpadeError, match="inputs changed: designs"):
        _stage(tmp_path, inp, a=1).check()
    forced = Stage.begin("demo", tmp_path / "out.jsonl", {"a": 2}, {"designs": [inp]}, force=True)
    assert forced.check() is False


def test_begin_takes_fingerprints_a_stage_already_took(tmp_path, monkeypatch):
    """regret hashes its rollouts while it scans them: begin uses those fingerprints, in the order
    of the roles given, hashes only the other roles, and dates the run from when it started."""
    from spade_cli.core import artifacts

    inp, rolls = tmp_path / "in.jsonl", tmp_path / "rollouts.jsonl"
    write_jsonl(inp, [D])
    write_jsonl(rolls, [D, D])
    taken = [artifacts.fingerprint(rolls)]
    hashed: list = []
    real = artifacts.fingerprint
    monkeypatch.setattr(artifacts, "fingerprint", lambda p, *a: hashed.append(p) or real(p, *a))
    st = Stage.begin("demo", tmp_path / "out.jsonl", {}, {"envs": [inp], "rollouts": [rolls]},
                     hashed={"rollouts": taken}, started=123.0)
    assert list(st.inputs) == ["envs", "rollouts"] and st.inputs["rollouts"] is taken
    assert hashed == [inp] and st.started == 123.0


def test_hand_edited_output_is_not_up_to_date(tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [D])
    st = _stage(tmp_path, inp)
    with st.writer() as w:
        w.write(parse(D))
    st.commit(1)
    (tmp_path / "out.jsonl").write_text("")
    with pytest.raises(SpadeError, match="modified after its manifest"):
        _stage(tmp_path, inp).check()


def test_resume_drops_a_torn_last_line(tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [D])
    st = _stage(tmp_path, inp)
    st.partial.write_text(json.dumps({"n": 1}) + "\n" + json.dumps({"n": 2}) + "\n" + '{"n": 3')
    assert st.resume() == [{"n": 1}, {"n": 2}]
    with st.writer() as w:
        w.write({"n": 3})
    assert [json.loads(x)["n"] for x in st.partial.read_text().splitlines()] == [1, 2, 3]


def test_kill_during_atomic_write_never_leaves_a_partial_file(tmp_path):
    """A writer killed with SIGKILL mid-write leaves the old file (or none) under the final name."""
    target = tmp_path / "big.jsonl"
    script = textwrap.dedent(f"""
        import sys
        from spade_cli.core.artifacts import write_jsonl
        def rows():
            for i in range(10**9):
                if i == 2000:
                    print("writing", flush=True)
                yield {{"schema": "spade.design/1", "code": "x" * 100, "hint": str(i)}}
        write_jsonl({str(target)!r}, rows())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not target.exists()


def test_a_stage_with_no_rows_still_publishes_an_empty_output(tmp_path):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [D])
    st = _stage(tmp_path, inp)
    assert st.resume() == []
    manifest = st.commit(0)
    assert (tmp_path / "out.jsonl").read_text() == "" and manifest["output"]["rows"] == 0
    assert _stage(tmp_path, inp).check() is True


def test_a_checkpoint_retrained_in_place_is_a_new_input(tmp_path):
    """Weights over 4 MiB are not hashed whole, but a retrain that keeps every file name and size
    (the same architecture) still changes the fingerprint; a byte-identical copy does not."""
    import shutil

    from spade_cli.core.artifacts import fingerprint

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    weights = bytearray(os.urandom(12 << 20))
    (ckpt / "model.safetensors").write_bytes(weights)
    before = fingerprint(ckpt)["sha256"]
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    assert fingerprint(copy)["sha256"] == before
    for at in (100, len(weights) - 100):  # a change near either end of the weights
        changed = bytearray(weights)
        changed[at] ^= 0xFF
        (ckpt / "model.safetensors").write_bytes(changed)
        assert fingerprint(ckpt)["sha256"] != before


def test_a_run_made_before_the_fingerprint_change_stays_up_to_date(tmp_path):
    """A manifest whose checkpoint fingerprints were made by version 1 (no "v": sizes and small
    files only) is compared in version 1, so a finished stage stays up to date after the upgrade
    and a run in progress resumes."""
    from spade_cli.core.artifacts import fingerprint, manifest_path

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(os.urandom(6 << 20))
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights.bin").write_bytes(os.urandom(6 << 20))
    st = Stage.begin("update", out, {"a": 1}, {"model": [ckpt]}, out_kind="dir")
    st.write_manifest(None, {})
    m = json.loads(manifest_path(out).read_text())
    assert m["inputs"]["model"][0]["v"] == 2 and m["output"]["v"] == 2
    for fp in [m["inputs"]["model"][0], m["output"]]:  # as an older spade wrote them
        fp.pop("v")
    m["inputs"]["model"][0]["sha256"] = fingerprint(ckpt, 1)["sha256"]
    m["output"]["sha256"] = fingerprint(out, 1)["sha256"]
    manifest_path(out).write_text(json.dumps(m))
    assert fingerprint(ckpt, 1)["sha256"] != fingerprint(ckpt)["sha256"]
    assert Stage.begin("update", out, {"a": 1}, {"model": [ckpt]}, out_kind="dir").status() == "up to date"
    (ckpt / "config.json").write_text("{}")  # a real change is still seen
    assert "inputs changed: model" in Stage.begin("update", out, {"a": 1}, {"model": [ckpt]}, out_kind="dir").status()


def test_an_input_role_recorded_later_is_not_compared_against_a_manifest_without_it(tmp_path):
    """warmstart started recording its pool as an input: a warm start made before (no "pool"
    role) stays up to date, while one made after compares the pool like any input."""
    from spade_cli.core.artifacts import manifest_path

    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "a.py").write_text("x = 1\n")
    out = tmp_path / "warm"
    out.mkdir()
    (out / "w.bin").write_bytes(b"w")
    Stage.begin("warmstart", out, {"a": 1}, {"pool": [pool]}, out_kind="dir").write_manifest(None, {})
    m = json.loads(manifest_path(out).read_text())
    m["inputs"].pop("pool")  # as written before the role existed
    manifest_path(out).write_text(json.dumps(m))
    (pool / "a.py").write_text("x = 2\n")
    assert Stage.begin("warmstart", out, {"a": 1}, {"pool": [pool]}, out_kind="dir").status() == "up to date"
    Stage.begin("warmstart", out, {"a": 1}, {"pool": [pool]}, out_kind="dir", force=True).write_manifest(None, {})
    (pool / "a.py").write_text("x = 3\n")
    assert "inputs changed: pool" in Stage.begin("warmstart", out, {"a": 1}, {"pool": [pool]},
                                                 out_kind="dir").status()


def test_options_added_later_stay_out_of_a_manifest_config_at_their_default(tmp_path):
    """An option added after runs were made is left out of the config at the default that keeps
    the old behaviour, so a stage written before it existed stays up to date; set to anything
    else it is compared like every option."""
    from spade_cli.core.artifacts import LATER_DEFAULTS, later_defaults_dropped

    for stage, later in LATER_DEFAULTS.items():
        old = {"seed": 0}
        assert later_defaults_dropped({**old, **later}, stage) == old, stage
        for key in later:
            changed = {**old, **later, key: "changed"}
            assert later_defaults_dropped(changed, stage) == {**old, key: "changed"}, (stage, key)
    assert later_defaults_dropped({"contract": "full"}, "rollout") == {"contract": "full"}  # its own stage only

    out = tmp_path / "warm"
    out.mkdir()
    Stage.begin("warmstart", out, {"seed": 0}, {}, out_kind="dir").write_manifest(None, {})
    now = later_defaults_dropped({"seed": 0, **LATER_DEFAULTS["warmstart"]}, "warmstart")
    assert Stage.begin("warmstart", out, now, {}, out_kind="dir").status() == "up to date"
    assert Stage.begin("warmstart", out, later_defaults_dropped({"seed": 0, "contract": "short"}, "warmstart"),
                       {}, out_kind="dir").status() != "up to date"
