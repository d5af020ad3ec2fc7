"""Envs that try to reach each other, the supervisor or the host, on both tiers: host-side facts.

Each test is one hole an attacker used before the sandbox ran one process per episode and
decoded every frame against a schema: forged replies, resource calls on other processes, SysV
IPC, unbounded scratch space, reading the checkout, and state carried from one episode to the
next. What is asserted is what a victim outside the env would see: its rlimits, the kernel's IPC
tables, bytes left on disk or in tmpfs, a secret in any output, the stage's exit status, and the
other envs of the same file still judged on their merits.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool, SandboxUnavailable
from tests.conftest import REPO, run_spade
from tests.test_sandbox_hostile import BENIGN, tier_pool  # noqa: F401 - the two-tier pool fixture

pytestmark = pytest.mark.integration


def env(step: str, top: str = "", reset: str = "") -> str:
    """An env whose step runs ``step`` (which may set ``obs``), then ends after three steps."""
    body = "\n".join("        " + ln for ln in step.strip("\n").splitlines())
    pre = "\n".join("        " + ln for ln in reset.strip("\n").splitlines()) or "        pass"
    return (f"import gymnasium as gym\n{top}\nclass E(gym.Env):\n"
            "    def reset(self, *, seed=None, options=None):\n        super().reset(seed=seed)\n"
            f"        self.t = 0\n{pre}\n        return 'start', {{}}\n"
            "    def step(self, action):\n        self.t += 1\n        obs = 'ok'\n"
            f"{body}\n        return obs, 0.0, self.t >= 3, False, {{}}\n")


def play(pool, code: str, steps: int = 3, seed: int = 11) -> tuple[str | None, list[str], str]:
    """(error reason or None, observations, env output) of one episode."""
    try:
        w = pool.open(code, "hostile")
    except EnvError as err:
        return err.reason, [], err.detail
    obs: list[str] = []
    try:
        obs.append(w.reset("ep", seed)[0])
        for _ in range(steps):
            o, _r, term, trunc, _i = w.step("ep", "go")
            obs.append(o)
            if term or trunc:
                break
    except EnvError as err:
        return err.reason, obs, w.output + err.detail
    finally:
        w.close()
    return None, obs, w.output


def assert_pool_serves(pool) -> None:
    w = pool.open(BENIGN, "benign")
    assert w.reset("b", 1) == ("ready", {}) and w.step("b", "hi") == ("echo hi", 1.0, True, False, {})
    w.close()


# -- 1. forged replies ------------------------------------------------------------------------------

FORGE = """
import os, stat, struct, msgpack
def send_raw(body):
    for fd in range(3, 32):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, struct.pack('>I', len(body)) + body)
        except OSError:
            pass
def forge(obj):
    send_raw(msgpack.packb(obj))
"""
FORGERIES = {
    "setup_failed": {"t": "setup_failed", "detail": "forged"},
    "sandbox_setup_reason": {"t": "err", "reason": "sandbox_setup", "detail": "forged"},
    "unhashable_reason": {"t": "err", "reason": ["x"], "detail": ""},
    "odd_info_keys": {"t": "step", "obs": "x", "reward": 0.0, "term": False, "trunc": False, "info": {"a": {1: 2}}},
    "check_env_shape": {"t": "checked", "error": 5, "warnings": "no"},
    "old_shape": {"ok": False, "reason": "sandbox_setup"},
}


@pytest.mark.parametrize("name", FORGERIES)
def test_a_forged_reply_is_that_envs_violation(tier_pool, name) -> None:  # noqa: F811
    pool, _ = tier_pool
    reason, _, _ = play(pool, env(f"forge({FORGERIES[name]!r})", top=FORGE))
    assert reason == "sandbox_violation"
    assert_pool_serves(pool)


def test_a_frame_out_of_turn_is_a_violation(tier_pool) -> None:  # noqa: F811
    """A well-formed reply sent on top of the real one: the extra frame is caught at the next call."""
    pool, _ = tier_pool
    fake = {"t": "step", "obs": "forged", "reward": 1.0, "term": False, "trunc": False, "info": {}}
    # numbered as the real reply will be: the request's number read off the stack
    number = ("import sys\nf = sys._getframe()\nwhile 'req' not in f.f_locals:\n    f = f.f_back\n"
              f"forge(dict({fake!r}, n=f.f_locals['req'].n))")
    for step in (f"forge({fake!r})", number):
        reason, obs, detail = play(pool, env(step, top=FORGE), steps=3)
        assert reason == "sandbox_violation" and len(obs) <= 3, (obs, detail)
    assert_pool_serves(pool)


def test_forgers_do_not_stop_validate(tmp_path: Path) -> None:
    """The stage goes on: every forger is invalid, every benign env of the same file is valid."""
    benign = (Path(__file__).parent.parent / "envs_benign" / "guess_number.py").read_text()
    hints = json.loads((Path(__file__).parent.parent / "envs_benign" / "hints.json").read_text())
    rows = [{"schema": "spade.design/1", "code": env(f"forge({f!r})", top=FORGE), "hint": "a hint for it"}
            for f in FORGERIES.values()]
    rows.insert(2, {"schema": "spade.design/1", "code": benign, "hint": hints["guess_number.py"]})
    designs = tmp_path / "d.jsonl"
    designs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "v.jsonl"
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["valid"] for g in got] == [False, False, True, False, False, False, False]
    assert {g["reason"] for i, g in enumerate(got) if i != 2} == {"sandbox_violation"}


# -- 2. resource calls on other processes ---------------------------------------------------------

def _limits(pid: int) -> str:
    return Path(f"/proc/{pid}/limits").read_text()


def test_prlimit_and_scheduling_of_other_processes_are_denied(tier_pool) -> None:  # noqa: F811
    pool, host = tier_pool
    w = pool.open(BENIGN, "probe")  # learn the zygote's host pid: the env process's parent
    zygote_pid = w.zygote.proc.pid if pool.tier == "process" else None
    w.close()
    victims = [os.getpid(), host.victim.pid] + ([zygote_pid] if zygote_pid else [])
    before = {p: _limits(p) for p in victims}
    code = env("""
import os, resource
out = []
# pid 0 means itself; in a pid namespace of its own so do 1 and getppid() (0): not other processes
for pid in [p for p in (os.getppid(), 1, __PIDS__) if p not in (0, os.getpid())]:
    for name, call in (("prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (4, 4))),
                       ("affinity", lambda: os.sched_setaffinity(pid, {0})),
                       ("priority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))):
        try:
            call()
            out.append("escaped %s %d" % (name, pid))
        except OSError as exc:
            out.append("blocked %s %d %d" % (name, pid, exc.errno))
obs = ";".join(out)
""".replace("__PIDS__", ", ".join(map(str, victims))))
    reason, obs, _ = play(pool, code, steps=1)
    assert reason is None and "escaped" not in obs[1], obs
    assert {p: _limits(p) for p in victims} == before
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 4
    assert host.victim.poll() is None
    assert_pool_serves(pool)  # the zygote still forks envs


# -- 3. SysV IPC and POSIX message queues -----------------------------------------------------------

def _ipc_tables() -> dict[str, list[str]]:
    return {k: Path(f"/proc/sysvipc/{k}").read_text().splitlines()[1:] for k in ("msg", "shm", "sem")}


def test_sysv_ipc_and_message_queues_are_denied(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    before = _ipc_tables()
    code = env("""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out = []
for name, call in (("msgget", lambda: libc.msgget(0x5ade, 0o1666)), ("shmget", lambda: libc.shmget(0x5ade, 4096, 0o1666)),
                   ("semget", lambda: libc.semget(0x5ade, 1, 0o1666)), ("shm_private", lambda: libc.shmget(0, 4096, 0o1600)),
                   ("mq_open", lambda: libc.mq_open(b"/spade-mq", 0o100 | 2, 0o666, None))):
    try:
        r = call()
    except AttributeError:
        out.append("absent " + name)
        continue
    out.append(("escaped " if r >= 0 else "blocked ") + name + " %d" % ctypes.get_errno())
obs = ";".join(out)
""")
    reason, obs, _ = play(pool, code, steps=1)
    assert reason is None and "escaped" not in obs[1] and obs[1].count("blocked") >= 4, obs
    assert _ipc_tables() == before  # nothing left in the host's IPC namespace
    assert not Path("/dev/mqueue/spade-mq").exists()


# -- 4. scratch quota --------------------------------------------------------------------------------

def _shmem_kb() -> int:
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("Shmem:"))
    return int(line.split()[1])


def test_scratch_space_has_a_total_cap_and_is_freed(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    base_shmem = _shmem_kb()
    cap = pool.config.scratch_mb
    # 25 files of 16 MiB (each under RLIMIT_FSIZE) are 400 MiB: far past the 64 MiB total
    reason, _, detail = play(pool, env("""
for i in range(25):
    with open("f%d" % i, "wb") as f:
        f.write(b"x" * (16 << 20))
"""), steps=1)
    assert reason == "disk_limit", detail
    # an env that catches the error itself still gets no more than the cap
    reason, obs, _ = play(pool, env("""
n = 0
try:
    for i in range(400):
        with open("g%d" % i, "wb") as f:
            f.write(b"y" * (1 << 20))
        n += 1
except OSError as exc:
    pass
obs = "wrote %d" % n
"""), steps=1)
    assert reason is None and cap - 8 <= int(obs[1].split()[1]) <= cap, obs
    assert_pool_serves(pool)
    # The episode's dir goes with its process, which the zygote kills at the episode's end and
    # reaps while serving later requests: within moments no byte stays on disk or in tmpfs RAM.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _shmem_kb() - base_shmem >= 16 << 10:
        pool.open(BENIGN, "tick").close()  # a request, during which the zygote reaps
        time.sleep(0.05)
    assert _shmem_kb() - base_shmem < 16 << 10
    left = [p for p in Path(pool.base).rglob("*") if p.is_file() and p.name != "zygote.log"]
    assert left == []


# -- 5. process-tier read roots ------------------------------------------------------------------------

def test_the_checkout_and_cwd_are_not_readable(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    targets = [REPO / "pyproject.toml", REPO / ".git" / "config", REPO / "README.md", Path.cwd() / "pyproject.toml"]
    code = env(f"""
out = []
for p in {[str(t) for t in targets]!r} + [{str(REPO)!r}]:
    try:
        out.append("escaped " + (open(p).read(200) if not p.endswith({REPO.name!r}) else str(__import__('os').listdir(p))))
    except OSError as exc:
        out.append("blocked %s %s" % (p, type(exc).__name__))
obs = ";".join(out)
""")
    reason, obs, output = play(pool, code, steps=1)
    assert reason is None and "escaped" not in obs[1], obs[1][:500]
    text = obs[1] + output
    assert 'name = "spade"' not in text and "[core]" not in text


# -- 6. no state across episodes, nothing that tells stages or arms apart ------------------------------

STATE = """
import sys, builtins
RESETS = {}
def locals_up_the_stack():
    f, seen = sys._getframe(), []
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, str):
                seen.append(v[:80])
            elif isinstance(v, dict):
                seen += [str(x)[:80] for x in v.values() if isinstance(x, (str, int))]
        f = f.f_back
    # its own dir (where a mount namespace allows, the same path for every env) and the host's
    # name for it: random, drawn per episode
    here = __import__("os").path.dirname(__import__("os").getcwd()) + "/env"
    return [s for s in seen if not s.startswith(here)]
"""


def test_each_episode_starts_in_a_fresh_process(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    code = env("obs = 'pid=%d' % __import__('os').getpid()", top=STATE,
               reset="RESETS[seed] = RESETS.get(seed, 0) + 1\nbuiltins.SPADE_MARK = getattr(builtins, 'SPADE_MARK', 0) + 1")
    code = code.replace("return 'start', {}", "return 'resets=%d mark=%d' % (RESETS[seed], builtins.SPADE_MARK), {}")
    w = pool.open(code, "stateful")
    firsts, pids = [], []
    for ep in ("unhinted-0", "hinted-0", "unhinted-1", "again"):
        firsts.append(w.reset(ep, 5)[0])
        pids.append(w.procs[ep].pid)  # as the zygote sees it
        w.step(ep, "x")
    w.close()
    assert firsts == ["resets=1 mark=1"] * 4  # the same seed four times, and each one is the first
    assert len(set(pids)) == 4  # four processes


FD_SCAN = """
import os, stat
socks = []
for fd in range(256):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            socks.append(fd)
    except OSError:
        pass
obs = 'sockets=%d' % len(socks)
"""


def test_env_processes_forked_ahead_hold_no_siblings_sockets(tier_pool) -> None:  # noqa: F811
    """Rollout's first tick finds its env processes forked ahead, many waiting at once: each must
    hold its own protocol socket and nothing of its waiting siblings (the zygote's ends of their
    hand-off sockets would let one env hand another its own channel)."""
    pool, _ = tier_pool
    pool.prestart((0,), episodes=12)
    workers = [pool.open(env(FD_SCAN) + f"\nVARIANT = {i}\n", f"fds{i}") for i in range(4)]
    seen = []
    for w in workers:
        for ep in range(3):
            w.reset(f"ep{ep}", ep)
            seen.append(w.step(f"ep{ep}", "x")[0])
            w.close_episode(f"ep{ep}")
        w.close()
    assert seen == ["sockets=1"] * 12
    assert_pool_serves(pool)


def test_no_episode_learns_its_position_from_pids_or_uids(tier_pool) -> None:  # noqa: F811
    """Pids count up: an env seeing its own would know how many episodes of the stage ran before
    it. Each env process is pid 1 of a pid namespace of its own, and (as root) its uid is drawn."""
    pool, _ = tier_pool
    if pool.tier == "process" and os.geteuid() != 0:
        pytest.skip("the process tier needs CAP_SYS_ADMIN for a pid namespace per env (a documented gap)")
    code = env("obs = '%d %d %d %d %d' % (os.getpid(), os.getppid(), os.getpgrp(), os.getsid(0), os.getuid())",
               top="import os")
    w = pool.open(code, "position")
    host_pids, seen = [], []
    for i in range(5):
        w.reset(f"ep{i}", 7)
        host_pids.append(w.procs[f"ep{i}"].pid)
        seen.append(w.step(f"ep{i}", "x")[0].split())
        w.close_episode(f"ep{i}")
    w.close()
    assert len(set(host_pids)) == 5  # the host sees five processes
    assert {tuple(s[:4]) for s in seen} == {("1", "0", "1", "1")}  # each env: pid 1, no parent in sight
    uids = [int(s[4]) for s in seen]
    if os.geteuid() == 0:  # a uid of its own per env, which follows the pids no more than chance
        assert len(set(uids)) == 5
        assert [u - uids[0] for u in uids] != [p - host_pids[0] for p in host_pids]


def test_the_env_sees_no_episode_id_or_stage(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    code = env("obs = repr(sorted(set(locals_up_the_stack())))", top=STATE)
    w = pool.open(code, "snoop")
    seen = []
    for ep in ("scripted_again-SECRET-ID-1", "hinted-SECRET-ID-2"):
        w.reset(ep, 99)
        seen.append(w.step(ep, "look")[0])
    w.close()
    # rollout's pool: its own action cap (2000 characters), everything else as validate's
    with SandboxPool(SandboxConfig(tier=pool.tier, max_action_chars=2000, step_timeout_s=0.5,
                                   reset_timeout_s=1.0, import_timeout_s=2.0, memory_mb=768)) as other:
        w = other.open(code, "snoop")
        w.reset("rollout-ep", 99)
        seen.append(w.step("rollout-ep", "look")[0])
        w.close()
    assert "SECRET-ID" not in "".join(seen)
    assert seen[0] == seen[1] == seen[2]  # nothing on the stack differs between episodes or stages


def _rollout(tmp_path: Path, tiny_model, code: str, hint: str, k: int) -> tuple[list[dict], Path]:
    """`spade rollout` (fake backend) of one env given as valid: its rows and the output path."""
    row = {"schema": "spade.validation/1", "code": code, "hint": hint, "valid": True, "reason": None,
           "checks": [], "stats": {}}
    envs, out = tmp_path / "v.jsonl", tmp_path / "r.jsonl"
    envs.write_text(json.dumps(row) + "\n")
    res = run_spade("rollout", "--model", tiny_model, "--backend", "fake", "--envs", envs, "--k", str(k),
                    "--out", out, "--max-turns", "2", "--max-tokens", "4")
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()], out


def test_a_reset_counting_env_earns_no_regret(tmp_path: Path, tiny_model) -> None:
    """Pays only at the second start of a seed: with shared processes that was the hinted episode."""
    code = env("obs = 'paid' if RESETS[self.seed] >= 2 else 'no'", top=STATE,
               reset="self.seed = seed\nRESETS[seed] = RESETS.get(seed, 0) + 1")
    code = code.replace("return obs, 0.0, self.t >= 3", "return obs, (1.0 if obs == 'paid' else 0.0), True")
    rows, _ = _rollout(tmp_path, tiny_model, code, "some hint text", k=3)
    assert len(rows) == 6 and {r["return"] for r in rows} == {0.0} and all(r["error"] is None for r in rows)


# -- 7. rollout enforces validate's hint check -------------------------------------------------------

def test_rollout_catches_a_case_changed_hint(tmp_path: Path, tiny_model) -> None:
    hint = "Press the red lever twice"
    code = env("obs = 'note: ' + HINT.upper()", top=f"HINT = {hint!r}")
    rows, out = _rollout(tmp_path, tiny_model, code, hint, k=2)
    assert {r["error"] for r in rows} == {"hint_leak"}
    assert hint.upper() not in out.read_text()  # withheld from the record too
    # and validate, whose seeds are drawn like rollout's, rejects the same env
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps({"schema": "spade.design/1", "code": code, "hint": hint}) + "\n")
    res = run_spade("validate", "--designs", d, "--out", tmp_path / "vv.jsonl")
    assert res.returncode == 0 and json.loads((tmp_path / "vv.jsonl").read_text())["reason"] == "hint_leak"


def test_validation_seeds_look_like_rollout_seeds(tmp_path: Path) -> None:
    """An env that behaves only for small seeds (0-3, validation's old ones) fails validation."""
    code = env("", reset="assert seed < 16, 'a large seed: this is rollout'")
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps({"schema": "spade.design/1", "code": code, "hint": "hint text here"}) + "\n")
    res = run_spade("validate", "--designs", d, "--out", tmp_path / "v.jsonl")
    assert res.returncode == 0 and json.loads((tmp_path / "v.jsonl").read_text())["reason"] == "reset_exception"


def test_setup_failure_is_reported_only_by_the_launcher(tier_pool) -> None:  # noqa: F811
    """An env that forges the launcher's own setup-failure frame gets a violation, never an abort."""
    pool, _ = tier_pool
    try:
        reason, _, _ = play(pool, env("forge({'t': 'setup_failed', 'detail': 'x'})", top=FORGE))
    except SandboxUnavailable:
        pytest.fail("a forged setup failure aborted the stage")
    assert reason == "sandbox_violation"
