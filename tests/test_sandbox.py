"""The sandbox API the rollout relies on, the frame codec, the seccomp program and `spade doctor`."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool, confine, protocol
from tests.conftest import run_spade

COUNTER = """
import gymnasium as gym
class Counter(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 1000))
        self.start = self.n
        return f"start {self.n} {(options or {}).get('tag', '')}", {"start": self.n}
    def step(self, action):
        self.n += 1
        return f"n={self.n} action={action}", 0.1, self.n - self.start >= 5, False, {"n": self.n}
"""


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(tier="process", step_timeout_s=0.5)) as p:
        yield p


# -- unit: codec and filter ------------------------------------------------------------------------

@pytest.mark.unit
def test_frames_round_trip_and_caps() -> None:
    r, w = os.pipe()
    protocol.send(w, protocol.Step(action="héllo"))
    reader = protocol.BlockingReader(r, 1 << 10)
    assert protocol.unpack(reader.recv(), protocol.REQUESTS) == protocol.Step(action="héllo")
    os.write(w, struct.pack(">I", 1 << 30))  # a header announcing 1 GiB is refused before any body
    with pytest.raises(protocol.FrameError) as e:
        protocol.BlockingReader(r, 1 << 20).recv()
    assert e.value.kind == "too_large"
    with pytest.raises(protocol.FrameError) as e:
        protocol.unpack(msgpack.packb([1, 2]))
    assert e.value.kind == "garbled"
    # an ext type (what a pickle-like payload could hide in) is inert data on the control channel
    # and refused outright where a typed reply is expected
    body = msgpack.packb({"t": "step", "obs": msgpack.ExtType(42, b"cos\nsystem\n"), "reward": 0.0,
                          "term": True, "trunc": False, "info": {}})
    assert isinstance(protocol.unpack(body)["obs"], protocol.msgspec.msgpack.Ext)
    with pytest.raises(protocol.FrameError):
        protocol.unpack(body, protocol.REPLIES[protocol.Step])
    os.close(r)
    os.close(w)


@pytest.mark.unit
@pytest.mark.parametrize("frame", [
    {"t": "err", "reason": ["unhashable"], "detail": ""},          # a reason that is not a string
    {"t": "step", "obs": "x", "reward": 1.0, "term": 1, "trunc": False, "info": {}},  # int flag
    {"t": "step", "obs": "x", "reward": "1", "term": True, "trunc": False, "info": {}},
    {"t": "step", "obs": "x", "reward": 1.0, "term": True, "trunc": False, "info": {1: 2}},  # key type
    {"t": "step", "obs": "x", "reward": 1.0, "term": True, "trunc": False, "info": {}, "extra": 1},
    {"t": "reset", "obs": "x", "info": {}},                          # a reply to another request
    {"t": "setup_failed", "detail": "forged"},                       # only the launcher's first frame
    {"ok": True, "obs": "x"},                                        # the old untagged shape
])
def test_forged_step_replies_are_garbled(frame) -> None:
    with pytest.raises(protocol.FrameError) as e:
        protocol.unpack(msgpack.packb(frame), protocol.REPLIES[protocol.Step])
    assert e.value.kind == "garbled"


@pytest.mark.unit
def test_seccomp_template_equals_a_fresh_build() -> None:
    for pid in (1, 2, 4095, 123_457, (1 << 22) - 1):
        assert confine.filter_for(pid) == confine.build_filter(pid)


@pytest.mark.unit
def test_no_pickle_or_eval_on_the_supervisor_side() -> None:
    import ast

    src = Path(confine.__file__).parent
    for name in ("protocol.py", "supervisor.py"):
        tree = ast.parse((src / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                    for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])}
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle"}, name
        assert not called & {"eval", "exec"}, name


@pytest.mark.unit
def test_seccomp_program_shape() -> None:
    prog = confine.build_filter(1234)
    assert len(prog) % 8 == 0 and 20 < len(prog) // 8 < 4096
    first = struct.unpack_from("HBBI", prog, 0)
    assert first == (0x20, 0, 0, 4)  # it starts by checking the architecture


# -- integration: the API used by rollout ----------------------------------------------------------

@pytest.mark.integration
def test_episodes_are_independent_instances(pool: SandboxPool) -> None:
    w = pool.open(COUNTER, "counter")
    a0, info_a = w.reset("a", seed=1, options={"tag": "x"})
    b0, info_b = w.reset("b", seed=2)
    assert a0.endswith(" x") and info_a["start"] != info_b["start"]
    obs, reward, term, trunc, info = w.step("a", "go")
    assert info["n"] == info_a["start"] + 1 and reward == 0.1 and (term, trunc) == (False, False)
    assert w.step("b", "go")[4]["n"] == info_b["start"] + 1  # b untouched by a's step
    w.close_episode("a")
    with pytest.raises(EnvError) as e:
        w.step("a", "go")  # a closed episode is gone
    assert e.value.reason == "step_exception" and w.alive  # the worker itself lives on
    again, _ = w.reset("a", seed=1, options={"tag": "x"})
    assert again == a0  # same seed, fresh instance, same start
    w.close()
    assert not w.alive


ANNOTATED = COUNTER.replace("import gymnasium as gym", "import dataclasses\nimport gymnasium as gym\n"
                            "@dataclasses.dataclass\nclass Move:\n    text: NotDefinedHere = None"
                            ).replace("self.n += 1", "self.n += 1 + (Move(action).text is None)")


@pytest.mark.integration
def test_supervisor_compiled_source_behaves_as_one_compiled_in_the_env(pool: SandboxPool, monkeypatch) -> None:
    from spade_cli.sandbox import envworker

    def play(expect_compiled: bool) -> list:
        w = pool.open(ANNOTATED, "annotated")
        assert (w.compiled is not None) is expect_compiled
        out = [w.reset("e", seed=3), w.step("e", "go"), w.step("e", "go")]
        w.close()
        return out

    ahead = play(True)  # postponed annotations in both: NotDefinedHere is never looked up
    monkeypatch.setattr(envworker, "_precompiled", lambda code, cap: None)
    assert play(False) == ahead
    with pytest.raises(EnvError) as e:  # a source that does not compile: the env process says so
        pool.open(COUNTER + "\ndef broken(:\n", "broken")
    assert e.value.reason == "syntax_error"


@pytest.mark.integration
def test_workers_in_parallel_threads(pool: SandboxPool) -> None:
    workers = [pool.open(COUNTER, f"c{i}") for i in range(4)]

    def drive(w):
        out = []
        for ep in range(5):
            obs, info = w.reset(f"e{ep}", seed=ep)
            for _ in range(5):
                obs, _, term, _, info = w.step(f"e{ep}", f"t{threading.get_ident()}")
            out.append(info["n"] - 5)
            w.close_episode(f"e{ep}")
        return out

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(drive, workers))
    assert all(r == results[0] for r in results)  # same seeds -> same starts in every process
    for w in workers:
        w.close()


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(x) for x in fh.read().split()}


@pytest.mark.integration
def test_prestart_forks_the_first_ticks_env_processes_ahead() -> None:
    """``prestart(episodes=n)`` leaves n confined children waiting in the zygote, and the next n
    episodes start in them (oldest first) instead of in processes forked on demand."""
    with SandboxPool(SandboxConfig(tier="process")) as fresh:
        fresh.prestart((0,))
        zyg = fresh.zygote(0).proc.pid  # the process tier's zygote is spade's own child
        assert len(_children(zyg)) == 0  # nothing asked for yet, nothing forked
        fresh.prestart((0,), episodes=6)
        deadline = time.monotonic() + 10
        while len(_children(zyg)) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        waiting = _children(zyg)
        assert len(waiting) == 6
        w = fresh.open(COUNTER, "ahead")
        played = set()
        for i in range(6):
            w.reset(f"e{i}", i)
            played.add(w.procs[f"e{i}"].pid)
            w.step(f"e{i}", "x")
            w.close_episode(f"e{i}")
        w.close()
        assert played <= waiting and len(played) == 6  # the six episodes ran in the six forked ahead


@pytest.mark.integration
def test_dead_worker_stays_dead_and_pool_recovers(pool: SandboxPool) -> None:
    w = pool.open(COUNTER.replace("self.n += 1", "self.n += 1\n        while action == 'hang': pass"))
    w.reset("e", 0)
    with pytest.raises(EnvError) as e:
        w.step("e", "hang")
    assert e.value.reason == "step_timeout" and not w.alive
    for call in (lambda: w.step("e", "x"), lambda: w.reset("f", 0)):
        with pytest.raises(EnvError) as again:
            call()
        assert again.value.reason == "step_timeout"  # the original reason, every time
    fresh = pool.open(COUNTER)
    assert fresh.reset("e", 0)[0].startswith("start")
    fresh.close()


@pytest.mark.integration
def test_episode_budget(pool: SandboxPool) -> None:
    cfg = SandboxConfig(tier="process", step_timeout_s=0.5, episode_timeout_s=0.3)
    with SandboxPool(cfg) as p:
        w = p.open(COUNTER.replace("self.n += 1", "self.n += 1\n        import time; time.sleep(0.12)"))
        w.reset("e", 0)
        with pytest.raises(EnvError) as e:
            for _ in range(5):
                w.step("e", "x")
        assert e.value.reason == "step_timeout"


@pytest.mark.integration
def test_an_env_that_prints_more_than_its_pipe_holds_in_one_step_goes_on() -> None:
    """The supervisor waits for a reply in a blocking read and drains the output pipe between
    read slices: a step that prints 300 KB (over 4 pipes' worth, under the 1 MiB cap) blocks on
    the full pipe until a slice ends, and then completes; its output reaches ``worker.output``.
    Past the cap the same env is an ``output_flood``. The step timeout is wide: what is tested is
    that such a step completes at all, not how fast (a loaded machine stretches each slice, and a
    0.5 s timeout then raced the drain; recipes/bench_sandbox.py measures the speed)."""
    chatty = COUNTER.replace("self.n += 1", "self.n += 1\n        print('p' * 299_999 + 'END')")
    with SandboxPool(SandboxConfig(tier="process", step_timeout_s=10.0)) as wide:
        w = wide.open(chatty)
        w.reset("e", 0)
        for _ in range(3):
            obs, *_ = w.step("e", "x")
            assert obs.startswith("n=")
        assert w.output.rstrip().endswith("END")
        with pytest.raises(EnvError) as e:
            w.step("e", "x")  # the fourth 300 KB passes 1 MiB
        assert e.value.reason == "output_flood"


@pytest.mark.integration
def test_action_is_truncated(pool: SandboxPool) -> None:
    w = pool.open(COUNTER.replace('f"n={self.n} action={action}"', 'str(len(action))'))
    w.reset("e", 0)
    assert w.step("e", "x" * 100_000)[0] == str(pool.config.max_action_chars)
    w.close()


@pytest.mark.integration
def test_doctor_json_and_table() -> None:
    r = run_spade("doctor", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert {"bubblewrap", "landlock", "seccomp", "cgroups", "identity", "gpus", "backends", "tier"} <= set(report)
    assert report["seccomp"]["ok"] is True  # the process tier needs it; CI must have it
    assert report["tier"]["tier"] in ("process", "strong")
    # A backend is reported usable only when its library is installed, not when spade's lazy
    # wrapper module imports.
    from importlib.util import find_spec

    assert report["backends"]["vllm"]["ok"] is (find_spec("vllm") is not None)
    assert report["backends"]["hf"]["ok"] is True
    table = run_spade("doctor")
    assert table.returncode == 0 and "sandbox tier" in table.stderr
    assert json.loads(table.stdout)["tier"] == report["tier"]["tier"]


@pytest.mark.unit
def test_readable_by_others(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "inner").mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    assert confine.readable_by_others(["/usr"])
    assert not confine.readable_by_others([str(closed / "inner")])
    assert not confine.readable_by_others([str(tmp_path / "missing")])


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop happens only when spade runs as root")
@pytest.mark.parametrize("keep_read_search", [False, True])
def test_drop_privileges_in_a_child(tmp_path: Path, keep_read_search: bool) -> None:
    """The root path env processes take: a uid and gid of their own, no way back, and at most
    CAP_DAC_READ_SEARCH (kept for an interpreter only root can reach, under Landlock)."""
    work = tmp_path / "w"
    work.mkdir()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            uid = confine.env_uid(os.getpid())
            fd = os.open(work, os.O_RDONLY)  # tmp_path's parents are root's 0700: look via an fd
            confine.drop_privileges(str(work), uid, keep_read_search=keep_read_search)
            eff = int(next(ln for ln in Path("/proc/self/status").read_text().splitlines()
                           if ln.startswith("CapEff:")).split()[1], 16)
            ok = (os.getresuid() == (uid,) * 3 and os.getresgid() == (uid,) * 3 and os.getgroups() == []
                  and os.fstat(fd).st_uid == uid and uid >= 1 << 30
                  and eff == ((1 << confine.CAP_DAC_READ_SEARCH) if keep_read_search else 0))
            try:
                os.setuid(0)
            except PermissionError:
                code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.unit
def test_bwrap_mounts_tmp_before_binding_the_interpreter() -> None:
    """A venv or checkout under /tmp must stay visible: the tmpfs on /tmp is mounted first."""
    from spade_cli.sandbox.probe import bwrap_argv

    argv = bwrap_argv("bwrap", {}, "/tmp/checkout")
    tmpfs = argv.index("--tmpfs")
    binds = [i for i, a in enumerate(argv) if a == "--ro-bind"]
    assert argv[tmpfs + 1] == "/tmp" and binds and tmpfs < min(binds)
