"""The bookkeeping of the GPU check (recipes/gpu_check.py run): one line per finished part, then
the summary line.

A part's record is the JSON object its command printed last, with its status (``ok``, ``skipped``
when the part says so or could not start, ``failed`` with the end of its log or when the check was
stopped during it, ``timeout`` when its own time limit killed it), seconds and limit. Records are
appended to ``OUT/parts.jsonl`` and flushed to disk as each part ends, so whatever finished
survives a failure, a timeout or a kill of the rest. One file rather than one per part: a machine
that hands back only a few files still returns them all. A rerun with the same OUT (``PARTS=zero2``
to retry one part) appends; the summary of a run gathers that run's records, and ``summary.json``
beside them holds the same line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TIMEOUT_RCS = (124, 137)  # GNU timeout: the limit passed; 137: it had to kill after the grace period
SHOWN = (("tokens_per_s", "tokens/s"), ("s_per_step", "s/step"), ("state_bytes", "state bytes"),
         ("state_save_s", "state save s"), ("state_load_s", "state load s"), ("gpu_peak_mb", "GPU peak MB"),
         ("relative", "relative difference"), ("params", "parameters"), ("generate_s", "s"), ("wheels", "wheels"),
         ("install_s", "install s"))


def _last_json(path: Path) -> dict | None:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
        obj = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _tail(path: Path, n: int = 25) -> list[str]:
    try:
        return [line[-300:] for line in path.read_text(errors="replace").splitlines()[-n:]]
    except OSError:
        return []


def _append(out: Path, rec: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "parts.jsonl", "a") as f:
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    said = ", ".join([f"{label} {rec[k]}" for k, label in SHOWN if rec.get(k) is not None] + [rec.get("why") or ""])
    print(f"gpu_check: {rec['part']} {rec['status']} in {rec.get('seconds', 0)} s: {said.strip(', ')}", file=sys.stderr)
    if rec.get("old_logps_s") is not None:  # the old-log-prob pass on its own line: its cost is the question
        print(f"gpu_check: {rec['part']} old log-probs {rec['old_logps_s']} s "
              f"(train {rec.get('train_s')} s)", file=sys.stderr)
    for line in rec.get("log_tail") or []:
        print(f"  | {line}", file=sys.stderr)


def part(out: Path, name: str, run: str, rc: int, seconds: int, limit: int, stdout: Path, log: Path) -> None:
    said = _last_json(stdout) if rc == 0 else None
    rec: dict = {"part": name, "run": run}
    if rc in TIMEOUT_RCS:
        rec.update(status="timeout", why=f"killed at its limit of {limit} s")
    elif rc != 0:
        rec.update(status="failed", why=f"exit {rc}")
    elif said is None:
        rec.update(status="failed", why="exit 0 but no JSON line on stdout")
    else:
        rec.update(said)
        rec.setdefault("status", "ok")
    rec.update(seconds=seconds, limit_s=limit)
    if rec["status"] in ("failed", "timeout"):
        rec["log_tail"] = _tail(log)
    _append(out, rec)


def summary(out: Path, run: str, extra: dict) -> int:
    recs: dict = {}
    path = out / "parts.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill: the parts before it still count
        if rec.get("run") == run:
            name = rec.pop("part")
            recs[name] = {k: v for k, v in rec.items() if k != "run"}
    bad = sorted(k for k, v in recs.items() if v.get("status") not in ("ok", "skipped"))
    ran = any(v.get("status") == "ok" for v in recs.values())
    line = {"check": "gpu_check", "run": run, **extra,
            "status": "incomplete" if bad else "ok" if ran else "nothing ran",
            "not_ok": bad, "skipped": sorted(k for k, v in recs.items() if v.get("status") == "skipped"),
            "parts": recs}
    text = json.dumps(line, separators=(",", ":"))
    tmp = out / f".summary.json.tmp-{os.getpid()}"
    tmp.write_text(text + "\n")
    os.replace(tmp, out / "summary.json")
    print(text)
    return 0 if not bad else 3


def note(out: Path, name: str, run: str, why: str, status: str = "skipped") -> None:
    """What the check itself says of a part it did not run to its end."""
    _append(out, {"part": name, "run": run, "status": status, "why": why, "seconds": 0})
