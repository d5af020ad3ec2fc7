"""`spade validate` through the real CLI and its core: verdicts, reasons, resume, manifest, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.core.records import env_id_for
from tests.conftest import run_spade

pytestmark = pytest.mark.integration

BENIGN_DIR = Path(__file__).parent / "envs_benign"
HINTS = json.loads((BENIGN_DIR / "hints.json").read_text())


def design(code: str | None, hint: str | None = "A useful hint for the agent.", **extra) -> dict:
    return {"schema": "spade.design/1", "code": code, "hint": hint, **extra}


def env_src(reset: str = "", step: str = "", ret: str = "return 'obs', 0.0, self.t >= 3, False, {}",
            top: str = "") -> str:
    """A small env; ``reset``/``step`` are one extra line each, ``ret`` is step's return line."""
    return (f"{top}\nimport gymnasium as gym\nclass E(gym.Env):\n"
            "    def reset(self, *, seed=None, options=None):\n        super().reset(seed=seed)\n"
            "        self.t = 0\n" + (f"        {reset}\n" if reset else "")
            + "        return 'start', {}\n    def step(self, action):\n        self.t += 1\n"
            + (f"        {step}\n" if step else "") + f"        {ret}\n")


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# One design per verdict that needs the full run (the static and sandbox ones are in the hostile suite).
VERDICTS = {
    "nondeterministic_random": (env_src(top="import random", ret="return str(random.random()), 0.0, "
                                        "self.t >= 3, False, {}"), "nondeterministic"),
    "nondeterministic_clock": (env_src(top="import time", ret="return str(time.time_ns()), 0.0, "
                                       "self.t >= 3, False, {}"), "nondeterministic"),
    "nondeterministic_hash": (env_src(ret="return str(hash('abc')), 0.0, self.t >= 3, False, {}"),
                              "nondeterministic"),
    # Module state no longer crosses episodes (one process each), so a counter kept there is
    # deterministic: the design is valid, and it cannot carry anything from one episode to the next.
    "module_state_is_per_episode": (env_src(top="COUNT = [0]", step="COUNT[0] += 1",
                                            ret="return str(COUNT[0]), 0.0, self.t >= 3, False, {}"),
                                    None),
    "return_over_one": (env_src(ret="return 'o', 0.6, self.t >= 3, False, {}"), "return_out_of_range"),
    "negative_return": (env_src(ret="return 'o', -0.5, self.t >= 3, False, {}"), "return_out_of_range"),
    "trivial_empty": (env_src(ret="return 'o', 1.0, True, False, {}"), "trivial"),
    "hint_leak": (env_src(ret="return 'Tip: ' + 'A useful hint for the agent.', 0.0, True, False, {}"),
                  "hint_leak"),
    "reset_bad": (env_src().replace("return 'start', {}", "return 'start'"), "reset_bad_return"),
}


def test_verdicts_and_order(tmp_path: Path) -> None:
    rows = [design(code) for code, _ in VERDICTS.values()]
    rows.append(design(None, parse_error="no ```python block"))
    rows.append(design("def broken(:\n"))
    rows.append(design((BENIGN_DIR / "guess_number.py").read_text(), hint=None))
    out = tmp_path / "validated.jsonl"
    r = run_spade("validate", "--designs", write(tmp_path / "d.jsonl", rows), "--out", out, "--workers", "2")
    assert r.returncode == 0, r.stderr
    got = read(out)
    expected = [reason for _, reason in VERDICTS.values()] + ["no_code", "syntax_error", "no_hint"]
    assert [g["reason"] for g in got] == expected
    assert all(g["schema"] == "spade.validation/1" and g["valid"] is (g["reason"] is None) for g in got)
    for g in got:  # the reason is the first failing check, every check is timed
        failing = [c for c in g["checks"] if not c["ok"]]
        assert bool(failing) is (g["reason"] is not None) and all(isinstance(c["ms"], float) for c in g["checks"])
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["rows"] == len(rows) and summary["valid"] == 1
    assert summary["invalid"]["nondeterministic"] == 3 and summary["tier"] in ("process", "strong")


def test_benign_envs_pass_and_manifest(tmp_path: Path) -> None:
    rows = [design((BENIGN_DIR / name).read_text(), hint) for name, hint in HINTS.items()]
    out = tmp_path / "validated.jsonl"
    r = run_spade("validate", "--designs", write(tmp_path / "d.jsonl", rows), "--out", out)
    assert r.returncode == 0, r.stderr
    got = read(out)
    assert [g["valid"] for g in got] == [True] * len(rows), [(g["reason"], g["checks"][-1]) for g in got]
    names = [c["name"] for c in got[0]["checks"]]
    assert names == ["code", "size", "syntax", "env_class", "duplicate", "import", "contract",
                     "gym_check_env", "return_range", "determinism", "hint_leak", "no_hint", "trivial",
                     "hint_is_answer", "format_only", "answer_table"]
    assert got[0]["env_id"] == env_id_for(rows[0]["code"], rows[0]["hint"])
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["sandbox"]["tier"] == json.loads(r.stdout.splitlines()[-1])["tier"]
    assert manifest["warnings"] == manifest["sandbox"]["warnings"]
    # a rerun is up to date; another config is refused without --force
    again = run_spade("validate", "--designs", tmp_path / "d.jsonl", "--out", out)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    other = run_spade("validate", "--designs", tmp_path / "d.jsonl", "--out", out, "--max-env-steps", "4")
    assert other.returncode == 1 and "--force" in other.stderr


def test_duplicates_against_memory_and_within_input(tmp_path: Path) -> None:
    code = (BENIGN_DIR / "guess_number.py").read_text()
    first = design(code, "hint one, long enough")
    rows = [first, design(code + "\n\n", "a different hint"), design((BENIGN_DIR / "json_tools.py").read_text())]
    memory = write(tmp_path / "memory.jsonl", [{"schema": "spade.memory/1", "env_id": env_id_for(rows[2]["code"],
                                                rows[2]["hint"]), "title": "t", "hint": "h", "history": []}])
    out = tmp_path / "v.jsonl"
    r = run_spade("validate", "--designs", write(tmp_path / "d.jsonl", rows), "--out", out, "--memory", memory)
    assert r.returncode == 0, r.stderr
    assert [g["reason"] for g in read(out)] == [None, "duplicate", "duplicate"]


def test_bad_row_is_an_input_error(tmp_path: Path) -> None:
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps(design("x = 1\n")) + "\n{not json\n")
    r = run_spade("validate", "--designs", d, "--out", tmp_path / "v.jsonl")
    assert r.returncode == 1 and f"{d}:2" in r.stderr
    assert not (tmp_path / "v.jsonl").exists()
    usage = run_spade("validate", "--designs", d, "--out", tmp_path / "v.jsonl", "--tier", "bogus")
    assert usage.returncode == 2


def test_resume_does_not_redo_rows(tmp_path: Path) -> None:
    """Rows already in the partial (a killed run) are kept as they are; only the rest is validated."""
    from spade_cli.core.artifacts import Stage
    from stages import validate

    rows = [design((BENIGN_DIR / n).read_text(), h) for n, h in HINTS.items()]
    d = write(tmp_path / "d.jsonl", rows)
    out = tmp_path / "v.jsonl"
    cfg = {"memory": None, "tier": "auto", "min_tier": "process", "max_steps": 16, "seed": 0,
           "trivial_return": 0.8}
    stage = Stage.begin("validate", out, cfg, {"designs": [d]})
    marker = {**rows[0], "schema": "spade.validation/1", "valid": True, "reason": None, "checks": [],
              "stats": {"marker": "from the first run"}}
    stage.partial.write_text(json.dumps(marker) + "\n" + '{"torn": ')  # a kill mid-line
    summary = validate.run(d, out, config=cfg)
    got = read(out)
    assert summary["resumed"] == 1 and len(got) == len(rows)
    assert got[0]["stats"] == {"marker": "from the first run"}
    assert all(g["valid"] for g in got[1:])


def test_min_tier_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    from spade_cli.sandbox import SandboxUnavailable, probe

    monkeypatch.setattr(probe, "probe_bwrap", lambda: {"ok": False, "path": None, "source": "not found",
                                                       "detail": "bwrap: setting up uid map: Permission denied"})
    tier, _, warnings = probe.choose_tier("auto", "process")
    assert tier == "process" and "bubblewrap unavailable" in warnings[0]
    with pytest.raises(SandboxUnavailable, match="below --min-tier strong"):
        probe.choose_tier("auto", "strong")
    with pytest.raises(SandboxUnavailable, match="--tier strong requested"):
        probe.choose_tier("strong", "process")


def test_kill_9_then_resume(tmp_path: Path) -> None:
    """A validate killed with SIGKILL leaves no sandbox process behind and resumes where it stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    slow = env_src(reset="import time; time.sleep(0.05)")
    # tuples of other lengths that the env reads: other numbers alone, or a name nothing reads, would
    # make near-duplicates, and the same observations behavioural ones
    rows = [design(slow.replace("class E", f"K = ({'0, ' * (i + 1)})\nclass E").replace(
        "return 'obs'", "return 'obs' * len(K)"), f"hint number {i} for the agent") for i in range(12)]
    d = write(tmp_path / "d.jsonl", rows)
    out = tmp_path / "v.jsonl"
    argv = [sys.executable, "-m", "spade_cli", "validate", "--designs", str(d), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    while time.monotonic() < deadline:
        partial = list(tmp_path.glob("v.jsonl.partial-*"))
        if partial and partial[0].read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    sandbox = _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # the CLI only: its zygotes must notice and exit by themselves
    proc.wait()
    assert partial and not out.exists()
    assert len(sandbox) >= 2  # two zygotes (and an env process) were running
    first = partial[0].read_text().count("\n")
    time.sleep(1.5)
    leftovers = [p for p in sandbox if _alive(p)]
    assert not leftovers, f"sandbox processes outlived the killed run: {leftovers}"
    r = run_spade("validate", "--designs", d, "--out", out, "--workers", "1")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["resumed"] >= first >= 2 and summary["rows"] == 12
    assert [g["valid"] for g in read(out)] == [True] * 12


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def test_one_process_per_episode_and_none_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process the zygote hands out plays exactly one episode: the import's process plays
    the first contract episode and gymnasium's checker runs in the last one's, after it."""
    from spade_cli.core.records import Design
    from spade_cli.sandbox import SandboxConfig, SandboxPool
    from spade_cli.sandbox.supervisor import Zygote
    from stages.validate import validate_design

    handed: list[int] = []
    real = Zygote.request

    def counting(self, msg, fds=()):
        reply = real(self, msg, fds)
        if msg.get("op") == "spawn" and "pid" in reply:
            handed.append(reply["pid"])
        return reply

    monkeypatch.setattr(Zygote, "request", counting)
    name = "arithmetic_chain.py"  # declares its spaces, so gymnasium's checker runs for real
    d = Design(code=(BENIGN_DIR / name).read_text(), hint=HINTS[name])
    with SandboxPool(SandboxConfig()) as pool:
        fields = validate_design(d, pool, max_steps=16, seed=0, trivial_return=0.8)
    assert fields["valid"], fields["reason"]
    checks = {c["name"]: c for c in fields["checks"]}
    assert checks["gym_check_env"]["detail"] == "passed", checks["gym_check_env"]
    probe_episodes = sum(p["episodes"] for p in fields["stats"]["probes"].values())
    # 4 contract episodes, 1 determinism episode, the probes, the behavioural fingerprint's episode;
    # no process for the import or the checker
    assert len(handed) == 4 + 1 + probe_episodes + 1, (len(handed), probe_episodes)


def test_trivial_is_confirmed_on_more_seeds() -> None:
    """A degenerate policy that hits on one seed rejects the design only when it hits on at least
    two of three more: the env below pays the empty reply on seeds divisible by 10 only."""
    from spade_cli.core.records import Design
    from spade_cli.sandbox import SandboxConfig, SandboxPool
    from stages.validate_hacks import confirm_trivial

    code = env_src(reset="self.lucky = (seed or 0) % 10 == 0",
                   ret="return 'o', float(self.lucky and action == ''), True, False, {}")
    d = Design(code=code, hint="h")
    empty = {"empty": lambda s: (lambda t: "")}
    with SandboxPool(SandboxConfig()) as pool:
        unlucky = confirm_trivial(d, pool, {"empty": 1.0}, empty, lambda i: 10 * i + 1, max_steps=4, threshold=0.8)
        lucky = confirm_trivial(d, pool, {"empty": 1.0}, empty, lambda i: 10 * i, max_steps=4, threshold=0.8)
        once = confirm_trivial(d, pool, {"empty": 1.0}, empty, lambda i: 10 * i + (i % 3 != 0), max_steps=4,
                               threshold=0.8)
    assert unlucky == {} and once == {}
    assert lucky == {"empty": "3 of 3 seeds"}  # the contract seed and the first two confirming ones
