"""A second attack pass, on both tiers: what an env could still learn, hold or break.

Each test is one hole found by attacking the sandbox after the first catalog was closed: a frame
nested past the decoder's stack, a source nested past the parser's, the zygote's bookkeeping
reachable from the env's stack, validation's seeds computed by the env itself, memory held in
anonymous files, and other env processes seen through ``/proc``, inotify or the link count of the
working dirs' parent. The assertions are host-side: the stage's exit status and verdicts, the
kernel's shared memory, and what one env sees while others run beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spade_cli.core.records import env_id_for
from tests.conftest import run_spade
from tests.hostile.test_isolation import FORGE, assert_pool_serves, env, play
from tests.test_sandbox_hostile import tier_pool  # noqa: F401 - the two-tier pool fixture

pytestmark = pytest.mark.integration

BENIGN_DIR = Path(__file__).parent.parent / "envs_benign"

# A step reply whose info is a list nested 200,000 deep: 200 KB, under the frame cap, and past the
# depth any decoder recurses to.
DEEP = FORGE + """
def forge_deep():
    head = (b'\\x87\\xa1t\\xa4step\\xa1n\\x01\\xa3obs\\xa1x\\xa6reward\\xcb' + b'\\x00' * 8
            + b'\\xa4term\\xc2\\xa5trunc\\xc2\\xa4info\\x81\\xa1a')
    send_raw(head + b'\\x91' * 200000 + b'\\xc0')
"""

# An `elif` chain 3,000 deep: valid syntax, under the size cap, past the parser's recursion limit.
DEEP_ELIF = ("import gymnasium as gym\ndef f(x):\n    if x == 0:\n        return 0\n"
             + "".join(f"    elif x == {i}:\n        return {i}\n" for i in range(1, 3000))
             + "class E(gym.Env):\n    def reset(self, *, seed=None, options=None):\n        return 'x', {}\n"
             "    def step(self, a):\n        return 'x', 0.0, True, False, {}\n")


def test_a_frame_nested_past_the_decoder_is_a_violation(tier_pool) -> None:  # noqa: F811
    pool, _ = tier_pool
    reason, _, _ = play(pool, env("forge_deep()", top=DEEP))
    assert reason == "sandbox_violation"
    assert_pool_serves(pool)


def test_validate_judges_deep_sources_and_frames_and_goes_on(tmp_path: Path) -> None:
    benign = (BENIGN_DIR / "guess_number.py").read_text()
    hint = json.loads((BENIGN_DIR / "hints.json").read_text())["guess_number.py"]
    hints = json.loads((BENIGN_DIR / "hints.json").read_text())
    # the last row is another valid env (a renamed copy of the first is a duplicate since dedup
    # ignores unread names), so the stage is seen to go on judging after the hostile rows
    rows = [{"code": benign, "hint": hint}, {"code": DEEP_ELIF, "hint": "a hint for it"},
            {"code": env("forge_deep()", top=DEEP), "hint": "a hint for it"},
            {"code": (BENIGN_DIR / "arithmetic_chain.py").read_text(), "hint": hints["arithmetic_chain.py"]}]
    designs, out = tmp_path / "d.jsonl", tmp_path / "v.jsonl"
    designs.write_text("".join(json.dumps({"schema": "spade.design/1", **r}) + "\n" for r in rows))
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["reason"] for g in got] == [None, "syntax_error", "sandbox_violation", None]


# What the env finds on its stack: every object bound to ``self`` in a frame above it, by type,
# with its attributes (containers by length). The zygote's own object is one of them.
SELVES = """
import sys
def selves():
    f, out = sys._getframe(), []
    while f is not None:
        s = f.f_locals.get('self')
        if s is not None and hasattr(s, '__dict__'):
            attrs = sorted((k, len(v) if hasattr(v, '__len__') and not isinstance(v, str) else
                            (v if isinstance(v, (int, float, bool, type(None))) else type(v).__name__))
                           for k, v in vars(s).items())
            out.append((type(s).__name__, attrs))
        f = f.f_back
    return repr(out)
"""


def test_the_zygotes_bookkeeping_does_not_reach_the_env(tier_pool) -> None:  # noqa: F811
    """Rollout forks many env processes ahead; validate never does. The zygote's counts of live
    and still-to-fork children were on the env's stack, so an env could tell the two apart."""
    pool, _ = tier_pool
    code = env("obs = selves()", top=SELVES)
    w = pool.open(code, "selves")
    w.reset("quiet", 5)
    quiet = w.step("quiet", "look")[0]
    w.close_episode("quiet")
    pool.prestart((0,), episodes=12)  # what rollout's first tick does
    w.reset("busy", 5)
    busy = w.step("busy", "look")[0]
    w.close()
    assert "Zygote" in quiet  # the probe does reach it...
    assert quiet == busy  # ...and finds nothing that differs


def _quine(hint: str) -> str:
    """An env that computes its own env id (it knows its own text and hint) and from it the seeds
    validation would use without a key: it plays fair there and pays anything elsewhere."""
    rest = ("import hashlib\nimport gymnasium as gym\nHINT = @HINT@\n"
            "def _d(*p):\n    return hashlib.sha256(':'.join(map(str, p)).encode()).hexdigest()\n"
            "SRC = T %% (T,)\n"
            "_norm = '\\n'.join(ln.rstrip() for ln in SRC.strip().splitlines())\n"
            "ENV_ID = hashlib.sha256((_norm + '\\x00' + ' '.join(HINT.split())).encode()).hexdigest()[:16]\n"
            "WATCHED = {int(_d('seed', 0, -1, ENV_ID, i)[:8], 16) & 0x7FFFFFFF for i in (0, 1, 2, 3, 10, 11)}\n"
            "class Guess(gym.Env):\n"
            "    def reset(self, *, seed=None, options=None):\n"
            "        super().reset(seed=seed)\n"
            "        self.fair, self.t = seed in WATCHED, 0\n"
            "        self.target = int(self.np_random.integers(1, 101))\n"
            "        return 'I picked a number from 1 to 100. Guess it.', {}\n"
            "    def step(self, action):\n"
            "        self.t += 1\n"
            "        if not self.fair:\n"
            "            return 'Correct!', 1.0, True, False, {}\n"
            "        ok = action.strip() == str(self.target)\n"
            "        return ('Correct!' if ok else 'Wrong.'), float(ok), ok, self.t >= 12, {}\n"
            ).replace("@HINT@", repr(hint))
    template = "T = %r\n" + rest
    return template % (template,)


def test_an_env_cannot_compute_validations_seeds(tmp_path: Path) -> None:
    hint = "Use binary search: start at 50 and halve the interval after each answer."
    code = _quine(hint)
    ns: dict = {}
    exec(compile(code, "quine", "exec"), ns)  # noqa: S102 - the test's own source
    assert ns["SRC"] == code and ns["ENV_ID"] == env_id_for(code, hint)  # it does know its id
    designs, out = tmp_path / "d.jsonl", tmp_path / "v.jsonl"
    designs.write_text(json.dumps({"schema": "spade.design/1", "code": code, "hint": hint}) + "\n")
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0, res.stderr
    # the seeds it computed are not the ones it got: its degenerate payout shows
    assert json.loads(out.read_text())["reason"] == "trivial"


def _shmem_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    raise AssertionError("no Shmem in /proc/meminfo")


def test_anonymous_files_and_inotify_are_denied(tier_pool) -> None:  # noqa: F811
    """memfd files sat outside RLIMIT_AS and the scratch quota (2 GB per env process, parked in
    flight on a socketpair); inotify watched other episodes' dirs and carried a channel."""
    pool, _ = tier_pool
    hold = """
out = []
try:
    fds = [os.memfd_create('x') for _ in range(8)]
    for fd in fds:
        os.ftruncate(fd, 16 << 20)
        os.pwrite(fd, b'x' * (16 << 20), 0)
    HELD.extend(fds)
    out.append('memfd escaped: %d MiB held' % (16 * len(fds)))
except OSError as exc:
    out.append('memfd blocked: %s' % exc.strerror)
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(294 if platform.machine() == 'x86_64' else 26, 0)  # inotify_init1
out.append('inotify escaped' if fd >= 0 else 'inotify blocked: %d' % ctypes.get_errno())
obs = ' | '.join(out)
"""
    code = env(hold, top="import os, ctypes, platform\nHELD = []")
    before = _shmem_kb()
    w = pool.open(code, "memfd")
    w.reset("ep", 3)
    obs = w.step("ep", "go")[0]
    during = _shmem_kb()  # the episode is still open: anything it holds is held now
    w.close()
    assert "memfd blocked" in obs and "inotify blocked: 1" in obs, obs
    assert during - before < 64 << 10, (before, during)  # host shared memory did not grow by 64 MiB+


def test_no_env_sees_others_in_proc_or_in_its_dirs_parent(tier_pool) -> None:  # noqa: F811
    """With a dozen env processes alive beside it, an env finds only itself in /proc, and the dir
    above its working dir shows no sibling dirs (its link count counted them)."""
    pool, _ = tier_pool
    if pool.tier == "process" and os.geteuid() != 0:
        pytest.skip("the process tier needs CAP_SYS_ADMIN for its own /proc and dirs (a documented gap)")
    look = ("pids = [n for n in range(1, 2048) if os.path.exists('/proc/%d' % n)]\n"
            "gone = [p for p in sys.path if ('site-packages' in p or p == os.path.dirname(os.__file__))"
            " and not os.path.isdir(p)]\n"
            "obs = 'pids=%r parent_links=%d cwd=%s hidden=%r' % (pids, os.stat('..').st_nlink,"
            " os.path.basename(os.getcwd()), gone)")
    code = env(look, top="import os, sys")
    pool.prestart((0,), episodes=12)
    w = pool.open(code, "neighbours")
    seen = []
    for i in range(3):
        w.reset(f"ep{i}", i)
        seen.append(w.step(f"ep{i}", "look")[0])
        w.close_episode(f"ep{i}")
    w.close()
    # and the tmpfs over its dir's parent hid nothing else: every dir of the runtime is still there
    # (in the strong tier that parent is in bubblewrap's /tmp, where a venv may be bound)
    assert seen == ["pids=[1] parent_links=3 cwd=env hidden=[]"] * 3, seen


def test_rollout_seeds_follow_the_envs_file(tmp_path: Path, tiny_model) -> None:
    """Rollout's seeds are keyed by its input too: the same env beside another design gets other
    seeds, none of them the unkeyed seed an env could compute for itself, while a file that
    differs only in validation's timings gives the same seeds (runs must repeat)."""
    from spade_cli.rollout.episodes import episode_seed

    code = env("")
    row = {"schema": "spade.validation/1", "code": code, "hint": "some hint text", "valid": True,
           "reason": None, "checks": [{"name": "import", "ok": True, "detail": "", "ms": 1.5}], "stats": {}}
    other = {**row, "code": env("obs = 'other'")}
    retimed = {**row, "checks": [{"name": "import", "ok": True, "detail": "", "ms": 7.25}],
               "stats": {"step_ms_p50": 0.3}}
    eid = env_id_for(code, row["hint"])
    seeds = {}
    for name, rows in (("one", [row]), ("two", [row, other]), ("retimed", [retimed])):
        envs, out = tmp_path / f"{name}.jsonl", tmp_path / f"r-{name}.jsonl"
        envs.write_text("".join(json.dumps(r) + "\n" for r in rows))
        res = run_spade("rollout", "--model", tiny_model, "--backend", "fake", "--envs", envs, "--k", "2",
                        "--out", out, "--max-turns", "1", "--max-tokens", "2")
        assert res.returncode == 0, res.stderr
        got = [json.loads(x) for x in out.read_text().splitlines()]
        mine = sorted({(r["pair"], r["seed"]) for r in got if r["env_id"] == eid})
        assert len(mine) == 2  # hinted and unhinted share each pair's seed
        seeds[name] = [s for _, s in mine]
    unkeyed = [episode_seed(0, 0, eid, p) for p in range(2)]
    assert seeds["one"] != seeds["two"] and unkeyed not in seeds.values()
    assert seeds["retimed"] == seeds["one"]


@pytest.mark.unit
def test_the_samplers_draws_are_part_of_the_key() -> None:
    """One design alone: its id is public to it, the log-probabilities its sampler drew are not."""
    from spade_cli.core.records import parse
    from spade_cli.rollout.episodes import seed_key, seed_material

    base = {"schema": "spade.design/1", "code": env(""), "hint": "some hint text"}
    drawn = [parse({**base, "tokens": {"prompt_ids": [1], "completion_ids": [5, 6], "logprobs": [lp, -0.5]}},
                   "spade.design") for lp in (-1.25, -1.5)]
    bare = parse(base, "spade.design")
    keys = {seed_key([seed_material(d)]) for d in (*drawn, bare)}
    assert len(keys) == 3 and seed_material(bare) == bare.env_id
