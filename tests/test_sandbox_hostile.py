"""The hostile catalog against both tiers: the outcome, the pool's survival and host-side facts.

For every case in ``tests/hostile/cases.py`` and every tier that can run here, the test asserts
(a) the reason code or that the attack was refused, (b) the same pool still serves a benign env
afterwards, and (c) host-side facts: the loopback TCP, UDP, unix and abstract-unix listeners saw
no traffic, the victim process lives, no file appeared outside the env's dir and the grader file
is unchanged, no secret (env var, file) appears in any observation or env output, and no process
is left behind once the pool closes. The strong tier is skipped, with the probe's reason, when
bubblewrap cannot run here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool
from spade_cli.sandbox.probe import probe_bwrap
from tests.hostile.cases import CASES, Case

pytestmark = pytest.mark.integration

SECRET = "spade-fake-secret-7c1e0b9a"
BENIGN = """
import gymnasium as gym
class Echo(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "ready", {}
    def step(self, action):
        return "echo " + action, 1.0, True, False, {}
"""


class Host:
    """Targets an escaping env would hit, with counters the test reads afterwards."""

    def __init__(self, root: Path):
        self.hits = {"tcp": 0, "udp": 0, "unix": 0, "abstract": 0}
        self.root = root
        self.victim_dir = root / "victim"
        self.victim_dir.mkdir()
        os.chmod(self.victim_dir, 0o777)
        (self.victim_dir / "grader.py").write_text("def grade(x):\n    return 0\n")
        self.secret_file = root / "secret.txt"
        self.secret_file.write_text(SECRET)
        os.chmod(root, 0o755)
        self.secret_file.chmod(0o644)  # readable by anyone: only the sandbox keeps it away
        self.marker = root / "marker-escaped"
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = str(root / "host.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen()
        self.abstract_name = f"spade-test-{os.getpid()}-{root.name}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        self.victim = subprocess.Popen(["sleep", "600"])
        self.stop = False
        for name, sock in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            threading.Thread(target=self._accept, args=(name, sock), daemon=True).start()
        threading.Thread(target=self._recv_udp, daemon=True).start()

    def _accept(self, name: str, sock: socket.socket) -> None:
        while not self.stop:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.hits[name] += 1
            conn.close()

    def _recv_udp(self) -> None:
        while not self.stop:
            try:
                self.udp.recv(100)
            except OSError:
                return
            self.hits["udp"] += 1

    def render(self, case: Case) -> str:
        subs = {"__TCP_PORT__": str(self.tcp.getsockname()[1]), "__UDP_PORT__": str(self.udp.getsockname()[1]),
                "__UNIX_PATH__": self.unix_path, "__ABSTRACT__": self.abstract_name,
                "__SECRET_FILE__": str(self.secret_file), "__SECRET__": SECRET,
                "__VICTIM_DIR__": str(self.victim_dir), "__VICTIM_PID__": str(self.victim.pid),
                "__MARKER__": str(self.marker)}
        code = case.code
        for k, v in subs.items():
            code = code.replace(k, v)
        return code

    def close(self) -> None:
        self.stop = True
        for s in (self.tcp, self.udp, self.unix, self.abstract):
            s.close()
        self.victim.kill()
        self.victim.wait()


def _descendants() -> set[int]:
    """Pids of every live process below this one (zombies excluded)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parent[int(d)] = int(fields[1])
    out, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


TIERS = ["process", "strong"]


@pytest.fixture(scope="module", params=TIERS)
def tier_pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tier = request.param
    if tier == "strong":
        b = probe_bwrap()
        if not b["ok"]:
            pytest.skip(f"strong tier unavailable here: bubblewrap {b['source']}: {b['detail']}")
    os.environ["SPADE_FAKE_API_KEY"] = SECRET  # in the supervisor's environment, as a real key would be
    host = Host(tmp_path_factory.mktemp(f"host-{tier}"))
    before = _descendants() - {host.victim.pid}
    cfg = SandboxConfig(tier=tier, step_timeout_s=0.5, reset_timeout_s=1.0, import_timeout_s=2.0,
                        memory_mb=768, max_output_bytes=1 << 20)
    pool = SandboxPool(cfg)
    assert pool.tier == tier
    yield pool, host
    pool.close()
    left = _descendants() - before - {host.victim.pid}
    host.close()
    os.environ.pop("SPADE_FAKE_API_KEY", None)
    assert not left, f"processes left behind after the pool closed: {left}"


def play_case(pool: SandboxPool, code: str, case: Case) -> tuple[str, list[str], str]:
    """(outcome, observations, env output): outcome is a reason code, 'blocked', 'escaped' or 'ok'."""
    try:
        w = pool.open(code, case.name)
    except EnvError as err:
        return err.reason, [], err.detail
    observations: list[str] = []
    try:
        obs, _ = w.reset("ep", 0)
        observations.append(obs)
        for _ in range(case.steps):
            obs, reward, term, trunc, info = w.step("ep", case.action)
            assert type(reward) is float and type(term) is bool and type(info) is dict
            observations.append(obs)
            if term or trunc:
                break
    except EnvError as err:
        return err.reason, observations, w.output + err.detail
    finally:
        w.close()
    if any(o.startswith("escaped") for o in observations):
        return "escaped", observations, w.output
    if any(o.startswith("blocked") for o in observations):
        return "blocked", observations, w.output
    return "ok", observations, w.output


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(tier_pool, case: Case) -> None:
    pool, host = tier_pool
    if case.needs == "landlock" and pool.tier == "process" and not pool.config.landlock:
        pytest.skip("Landlock unavailable: the process tier cannot hide host files (a recorded warning)")
    grader_before = (host.victim_dir / "grader.py").read_text()
    outcome, observations, output = play_case(pool, host.render(case), case)
    # (a) the verdict
    assert outcome in case.expect, f"{case.name}: got {outcome}, observations {observations[-1:]!r:.300}"
    # (b) the pool survives and still runs a benign env
    w = pool.open(BENIGN, "benign")
    assert w.reset("b", 1) == ("ready", {})
    assert w.step("b", "hi") == ("echo hi", 1.0, True, False, {})
    w.close()
    # (c) host-side facts
    assert host.hits == {"tcp": 0, "udp": 0, "unix": 0, "abstract": 0}
    assert host.victim.poll() is None, "the victim process was killed"
    assert not host.marker.exists() and not Path("/tmp/spade-hostile-escape").exists()
    assert (host.victim_dir / "grader.py").read_text() == grader_before
    assert sorted(p.name for p in host.victim_dir.iterdir()) == ["grader.py"]
    text = "\n".join(observations) + output
    assert SECRET not in text and "root:x:0:0" not in text


def test_envs_cannot_affect_each_other(tier_pool) -> None:
    """Env A monkeypatches random and json in its process; env B, opened next, is untouched."""
    pool, _ = tier_pool
    a = pool.open("import random, builtins, gymnasium as gym\nrandom.Random.randint = lambda s, x, y: 7\n"
                  "import json\njson.dumps = None\nclass A(gym.Env):\n    def reset(self, *, seed=None, "
                  "options=None):\n        return 'a', {}\n    def step(self, action):\n"
                  "        return 'a', 0.0, True, False, {}\n")
    b = pool.open("import random, gymnasium as gym\nclass B(gym.Env):\n    def reset(self, *, seed=None, "
                  "options=None):\n        return str(random.Random(0).randint(0, 10 ** 9)) + ':' + "
                  "str(len('abc')), {}\n    def step(self, action):\n        return 'b', 0.0, True, False, {}\n")
    import random

    assert b.reset("e", 0)[0] == f"{random.Random(0).randint(0, 10 ** 9)}:3"
    a.close()
    b.close()


@pytest.mark.parametrize("tier", TIERS)
def test_the_cpu_rlimit_ends_a_step_as_a_timeout_not_a_crash(tier: str) -> None:
    """The RLIMIT_CPU backstop, with the step deadline far away: the env process is pid 1 of its pid
    namespace, where SIGXCPU's default action is dropped, so the hard limit's SIGKILL ends it; that is
    still the CPU limit (step_timeout), told by the CPU time the zygote reaps with it."""
    if tier == "strong" and not probe_bwrap()["ok"]:
        pytest.skip("strong tier unavailable here")
    pool = SandboxPool(SandboxConfig(tier=tier, cpu_s=1, step_timeout_s=30.0, reset_timeout_s=5.0,
                                     import_timeout_s=10.0, memory_mb=768))
    try:
        w = pool.open("import gymnasium as gym\nclass S(gym.Env):\n    def reset(self, *, seed=None, options=None):"
                      "\n        return 's', {}\n    def step(self, action):\n        while True:\n            pass\n")
        w.reset("e", 0)
        with pytest.raises(EnvError) as info:
            w.step("e", "x")
        assert info.value.reason == "step_timeout", info.value
        assert "killed by SIG" in str(info.value)
    finally:
        pool.close()


def test_kill_latency_after_deadline(tier_pool) -> None:
    """A step that never returns is reported within the step budget plus a small margin."""
    import time

    pool, _ = tier_pool
    w = pool.open("import gymnasium as gym\nclass S(gym.Env):\n    def reset(self, *, seed=None, options=None):"
                  "\n        return 's', {}\n    def step(self, action):\n        while True:\n            pass\n")
    w.reset("e", 0)
    t0 = time.monotonic()
    with pytest.raises(EnvError) as info:
        w.step("e", "x")
    took = time.monotonic() - t0
    assert info.value.reason == "step_timeout"
    # The margin covers scheduling on a busy machine (the poll wakes late, the zygote reaps); what
    # is tested is that the step deadline, not the 60 s episode budget or the CPU rlimit, ends it.
    assert took < pool.config.step_timeout_s + 1.5, took
    assert not w.alive
    with pytest.raises(EnvError):
        w.step("e", "x")
    assert signal.SIGKILL  # the zygote reaped it: its status is known
    assert w.exit is not None and w.exit.get("signal") == signal.SIGKILL
