"""The GPU check: spade's update and generation on one GPU without network, in parts that each report.

    python recipes/gpu_check.py wheels gpu_wheels     # first, on a networked CPU machine (docs/install.md)
    WHEELS=gpu_wheels python recipes/gpu_check.py run # on the GPU machine (bash recipes/gpu_check.sh: the same)
    DRY=1 python recipes/gpu_check.py run             # the CPU path at toy sizes (what the tests run)
    python recipes/gpu_check.py build WORK ...        # one part alone (recipes/gpu_check_parts.py)

``run`` takes the parts in this order, each in a process of its own under its own time limit
(LIMIT_<PART> seconds) and all of them inside BUDGET_S (480 s: the whole check takes under 8
minutes; a part the budget cannot fit is skipped; DRY=1 has four times the time for everything):

    install   the WHEELS folder pip-installed offline (--no-index --no-deps) into WORK/site; the
              image keeps its torch. Without WHEELS the environment is used as it is.
    build     a random Qwen3-0.6B-shaped model with untied embeddings at Qwen3's vocabulary
              (151,936), drawn on the device in bf16, and 32 episodes of 1,024 + 5,120 tokens
    update1   `spade update` under `accelerate launch`, one process, bf16, gradient checkpointing
    update2   the same from update1's checkpoint, resuming its trainer state
    zero2     update1 again under DeepSpeed ZeRO-2 (recipes/accelerate/zero2.yaml) in one process;
              skipped, with the reason, where deepspeed does not import
    resume    one process takes update1's two passes: its fp32 masters equal the chained updates'
    generate  the hf backend from update2's checkpoint on the GPU
    vllm      the vllm backend and `spade serve`; skipped without vllm

Each update reports tokens/s, seconds per step, the old-log-prob pass's seconds, the trainer
state's bytes and save/load seconds, peak host and GPU memory. Each part's JSON line is appended to
OUT/parts.jsonl the moment it ends (recipes/gpu_check_record.py; OUT defaults to WORK), its log goes
to WORK/<part>.log and OUT/logs.tgz, so a failure, a timeout or a kill costs that part only. The last
stdout line (also OUT/summary.json) gathers every part of this run; the exit status is 1 when a part
failed, 130 when the check was stopped by a signal (the running part is ended first). PARTS="zero2
resume" reruns some parts in the same WORK. DRY=1 (the default without a CUDA device): the same
parts on the CPU at toy sizes in fp32, a check that the plumbing works, not a measurement. VOCAB, N,
PROMPT, COMPLETION and BATCH change the sizes. Only the standard library is imported here: the
parts import torch in their own processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
PARTS = "install build update1 update2 zero2 resume generate vllm"
GRACE_S = 15  # after a part's limit: SIGTERM, then SIGKILL this much later (GNU timeout's -k)


class Stopped(Exception):
    """A signal to the check (Ctrl-C, a scheduler's SIGTERM)."""


def _stop(signum, frame) -> None:
    raise Stopped


def _end(proc: subprocess.Popen) -> int:
    """End a part's whole process group (accelerate's launcher has children): TERM, then KILL after
    the grace period; 124 when TERM sufficed, 137 when KILL was needed, as GNU timeout says."""
    for sig, rc in ((signal.SIGTERM, 124), (signal.SIGKILL, 137)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=GRACE_S)
            return rc
        except subprocess.TimeoutExpired:
            continue
    return 137


class Check:
    """One run of the check: its settings from the environment, its records in OUT."""

    def __init__(self, env: dict) -> None:
        wheels = env.get("WHEELS") or None
        if wheels and not Path(wheels).is_dir():
            print(f"gpu_check: WHEELS={wheels} is not a folder (python recipes/gpu_check.py wheels gathers one)",
                  file=sys.stderr)
            raise SystemExit(2)
        self.wheels = Path(wheels).resolve() if wheels else None
        self.work = Path(env.get("WORK") or tempfile.mkdtemp()).resolve()
        self.out = Path(env.get("OUT") or self.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.parts = env.get("PARTS", PARTS).split()
        self.limits = {p: int(env[f"LIMIT_{p.upper()}"]) for p in PARTS.split() if f"LIMIT_{p.upper()}" in env}
        # the checkout's code first, then what the install part puts in WORK/site, then the image's
        path = [str(REPO), str(self.work / "site"), env.get("PYTHONPATH", "")]
        self.env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))}
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                               capture_output=True, text=True, env=self.env)
        self.gpus = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
        self.dry = bool(int(env.get("DRY", int(self.gpus == 0))))
        # the CPU path checks the plumbing, not the time: its limits are 4x, so a busy machine passes too
        self.slack = 4 if self.dry else 1
        self.budget = int(env.get("BUDGET_S", 480 * self.slack))
        if self.dry:
            self.env["ACCELERATE_USE_CPU"] = "true"  # every part on the CPU, also on a machine with a GPU
        size = dict(vocab=1024, n=16, prompt=32, completion=96) if self.dry else \
            dict(vocab=151936, n=32, prompt=1024, completion=5120)
        self.size = {k: int(env.get(k.upper(), v)) for k, v in {**size, "batch": 4}.items()}
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.t0 = time.monotonic()
        self.running: tuple[str, subprocess.Popen] | None = None

    def plan(self):
        """(name, limit s, what it needs in WORK, its arguments), one part at a time: a generator, so
        that the generate part starts from what the parts before it left."""
        w, s = str(self.work), self.size
        update = ["--batch", str(s["batch"]), *([] if self.dry else ["--bf16"])]
        yield "install", 120, None, ["install", w, *(["--wheels", str(self.wheels)] if self.wheels else [])]
        yield "build", 120, None, ["build", w, "--shape", "dry" if self.dry else "gpu", "--vocab", str(s["vocab"]),
                                   "--n", str(s["n"]), "--prompt", str(s["prompt"]),
                                   "--completion", str(s["completion"])]
        yield "update1", 150, "model", ["update", w, "ck1", "--from", "model", *update]
        yield "update2", 150, "ck1", ["update", w, "ck2", "--from", "ck1", *update]
        yield "zero2", 180, "ck1", ["update", w, "ckz", "--from", "model", *update, "--zero2", "--like", "ck1"]
        yield "resume", 150, "ck2", ["resume", w, "--first", "ck1", "--chained", "ck2"]
        start = "ck2" if (self.work / "ck2").is_dir() else "model"
        small = ["--prompts", "2", "--n", "2", "--max-tokens", "16"] if self.dry else []
        yield "generate", 90, start, ["generate", w, "--from", start, *small]
        yield "vllm", 240, None, ["vllm", str(self.work / "vllm")]

    def part(self, name: str, limit: int, needs: str | None, args: list[str]) -> None:
        """One part under its own limit (what the budget leaves, if less); its last stdout line is its
        record, appended the moment it ends. Never raises for the part's own failure."""
        import gpu_check_record as rec

        limit = self.limits.get(name, limit * self.slack)
        left = int(self.budget - (time.monotonic() - self.t0) - 5)
        if left < 10:
            return rec.note(self.out, name, self.run_id, f"no time left in BUDGET_S={self.budget}")
        if needs is not None and not (self.work / needs).exists():
            return rec.note(self.out, name, self.run_id,
                            f"needs {self.work / needs}, which an earlier part did not write")
        limit = min(limit, left)
        print(f"gpu_check: {name} (limit {limit} s)", file=sys.stderr)
        stdout, log = self.work / f"{name}.out", self.work / f"{name}.log"
        t0 = time.monotonic()
        with open(stdout, "w") as o, open(log, "w") as e:
            # a session of its own: the whole part ends at its limit, and a signal reaches only the check
            proc = subprocess.Popen([sys.executable, __file__, *args], stdout=o, stderr=e, env=self.env,
                                    cwd=REPO, start_new_session=True)
            self.running = (name, proc)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                rc = _end(proc)
            self.running = None
        _end_group(proc)
        rec.part(self.out, name, self.run_id, rc, round(time.monotonic() - t0), limit, stdout, log)
        self.logs()

    def logs(self) -> None:
        tmp = self.out / ".logs.tgz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for log in sorted(self.work.glob("*.log")):
                tar.add(log, arcname=f"./{log.name}")
        os.replace(tmp, self.out / "logs.tgz")

    def summary(self) -> int:
        """The last stdout line: every part this run recorded; 1 when a part failed."""
        import gpu_check_record as rec

        extra = {"dry": self.dry, "gpus": self.gpus, "budget_s": self.budget,
                 "wall_s": round(time.monotonic() - self.t0)}
        try:
            return int(rec.summary(self.out, self.run_id, extra) != 0)
        except Exception as e:  # noqa: BLE001  (the summary itself broke: still one line, naming the records)
            print(f"gpu_check: no summary: {type(e).__name__}: {e}", file=sys.stderr)
            print(json.dumps({"check": "gpu_check", "run": self.run_id, "status": "no summary",
                              "records": str(self.out / "parts.jsonl")}))
            return 1

    def run(self) -> int:
        print(f"gpu_check: run {self.run_id}, DRY={int(self.dry)}, {self.gpus} GPU(s), WORK={self.work}, "
              f"OUT={self.out}, WHEELS={self.wheels or 'none'}, budget {self.budget} s, parts: "
              f"{' '.join(self.parts)}; {self.size['n']} rows of {self.size['prompt']} + "
              f"{self.size['completion']} tokens, vocab {self.size['vocab']}", file=sys.stderr)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            for name, limit, needs, args in self.plan():
                if name in self.parts:
                    self._safely(self.part, name, limit, needs, args)
        except Stopped:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if self.running is not None:  # end the running part, then still print what finished
                name, proc = self.running
                _end(proc)
                self._safely(self._note_stopped, name)
            self.summary()
            return 130
        return self.summary()

    def _note_stopped(self, name: str) -> None:
        import gpu_check_record as rec

        rec.note(self.out, name, self.run_id, "interrupted: this script got a signal", status="failed")

    def _safely(self, fn, *args) -> None:
        """A record that cannot be written costs that record, not the parts after it."""
        try:
            fn(*args)
        except (OSError, ValueError) as e:
            print(f"gpu_check: {args[0]} not recorded: {type(e).__name__}: {e}", file=sys.stderr)


def _end_group(proc: subprocess.Popen) -> None:
    """What a finished part left running in its group (a launcher's child) goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="every part in order, each under its own limit (settings from the environment)")
    p = sub.add_parser("wheels", help="gather the wheels the check installs offline (recipes/gpu_check_wheels.py)")
    p.add_argument("folder", type=Path, nargs="?", default=Path("gpu_wheels"))
    p.add_argument("--py-version", default="3.12", help="the GPU image's Python")
    p.add_argument("--max-mib", type=float, default=64, help="fail when the folder is larger")
    p.add_argument("--deepspeed", default="0.19.8")
    p.add_argument("--extra", nargs="*", default=[], help='more requirements, e.g. "regex==2026.12.2"')
    p = sub.add_parser("install")
    p.add_argument("work", type=Path)
    p.add_argument("--wheels", type=Path)
    p = sub.add_parser("build")
    p.add_argument("work", type=Path)
    p.add_argument("--shape", choices=("gpu", "dry"), default="gpu")
    for name, default in (("vocab", 151936), ("n", 32), ("prompt", 1024), ("completion", 5120), ("group", 4),
                          ("seed", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    p = sub.add_parser("update")
    p.add_argument("work", type=Path)
    p.add_argument("name")
    p.add_argument("--from", dest="start", default="model")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision and gradient checkpointing")
    p.add_argument("--zero2", action="store_true", help="accelerate's DeepSpeed ZeRO-2 (recipes/accelerate/zero2.yaml)")
    p.add_argument("--like", help="a checkpoint trained the same way without DeepSpeed, to compare with")
    p = sub.add_parser("resume")
    p.add_argument("work", type=Path)
    p.add_argument("--first", default="ck1")
    p.add_argument("--chained", default="ck2")
    p = sub.add_parser("generate")
    p.add_argument("work", type=Path)
    p.add_argument("--from", dest="start", default="ck2")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    for name in ("vllm", "smoke"):
        p = sub.add_parser(name)
        p.add_argument("work", type=Path, nargs="?", help="a work folder (default: a new temporary one)")
    return ap


def main() -> None:
    a = _parser().parse_args()
    if a.cmd == "run":
        sys.exit(Check(dict(os.environ)).run())
    if a.cmd == "wheels":
        import gpu_check_wheels

        print(gpu_check_wheels.gather(a.folder, a.py_version, a.max_mib, a.deepspeed, a.extra))
        return
    import gpu_check_parts as parts

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if a.cmd in ("vllm", "smoke"):
        a.work = a.work or Path(tempfile.mkdtemp())
        a.work.mkdir(parents=True, exist_ok=True)
        res = getattr(parts, a.cmd)(a.work.resolve())
    elif a.cmd == "install":
        res = parts.install(a.work, a.wheels)
    elif a.cmd == "build":
        res = parts.build(a.work, a.shape, a.vocab, a.n, a.prompt, a.completion, a.group, a.seed)
    elif a.cmd == "update":
        res = parts.update(a.work, a.name, a.start, a.batch, a.bf16, a.zero2, a.like)
    elif a.cmd == "resume":
        res = parts.resume(a.work, a.first, a.chained)
    else:
        res = parts.generate(a.work, a.start, a.prompts, a.n, a.max_tokens)
    print(json.dumps(res, separators=(",", ":")))


if __name__ == "__main__":
    main()
