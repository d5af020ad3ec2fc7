"""A one-node Slurm cluster on 127.0.0.1 for the `slurm` test tier: Debian's slurm-wlm and munge.

``start(dir)`` writes a munge key and a ``slurm.conf`` with the machine's real CPUs and memory
(``accounting_storage/none``, ``jobcomp/filetxt``, ``proctrack/linuxproc``: no slurmdbd, no cgroup
setup), starts ``munged``, ``slurmctld`` and ``slurmd`` in the foreground as children, and waits
until the node is idle. ``stop`` ends exactly those three processes by PID. Clients find the
cluster through ``SLURM_CONF`` in ``Cluster.env``. The partition oversubscribes cores (FORCE:4) so
that a reference job, a job under test and a serving fleet share a 2-core CI machine.

    python -m tests.slurm_cluster /tmp/slurm     # start one by hand; Ctrl-C stops it
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def missing() -> list[str]:
    return [d for d in DAEMONS if not shutil.which(d, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 512  # leave slurmd's own share
    return 1024


@dataclass
class Cluster:
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.root / "slurm.conf")}

    def run(self, *argv: str, check: bool = True) -> str:
        res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
        return res.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: str, timeout: float = 900) -> dict[str, str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                        "OUT_OF_MEMORY", "PREEMPTED"):
                return info
            self.skip_begin_delay(job_id, info)
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout}s")

    def skip_begin_delay(self, job_id: str, info: dict[str, str] | None = None) -> None:
        """A requeued job waits out a begin-time delay before it may start again: shorten it to 2 s.
        Not to 0: slurmd revokes the ended run's credential with one-second resolution, and a
        relaunch within that second is killed as "Job credential revoked" (the job then FAILS).
        Only a start more than 3 s away is moved, so repeated calls do not push it back."""
        info = self.job(job_id) if info is None else info
        if info.get("JobState") != "PENDING" or info.get("Reason") != "BeginTime":
            return
        try:
            start = time.mktime(time.strptime(info.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            start = float("inf")
        if start > time.time() + 3:
            self.run("scontrol", "update", f"jobid={job_id}", "StartTime=now+2", check=False)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # slurmd, slurmctld, munged: by PID, never by name
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def start(root: Path) -> Cluster:
    root.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool"):
        (root / d).mkdir(exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host, cpus = socket.gethostname(), os.cpu_count() or 1
    (root / "slurm.conf").write_text(f"""\
ClusterName=spadetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_mem_mb()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
    cluster = Cluster(root)
    env = {**os.environ, **cluster.env, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"}
    logs = open(root / "daemons.log", "ab")
    # --force: pytest tmp dirs are 0700, which munged refuses for its socket without it
    argvs = [["munged", "-F", "--force", f"--socket={root}/munge.socket", f"--key-file={key}",
              f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"],
             ["slurmctld", "-D", "-i", "-f", str(root / "slurm.conf")],
             ["slurmd", "-D", "-f", str(root / "slurm.conf")]]
    try:
        for argv in argvs:
            cluster.procs.append(subprocess.Popen(argv, env=env, stdout=logs, stderr=logs,
                                                  start_new_session=True))
            time.sleep(0.5 if argv[0] == "munged" else 0)
        deadline = time.time() + 60
        while time.time() < deadline:
            if any(p.poll() is not None for p in cluster.procs):
                raise RuntimeError(f"a Slurm daemon exited; see {root}/daemons.log and {root}/slurm*.log")
            out = cluster.run("sinfo", "-h", "-o", "%T", check=False).strip()
            if out == "idle":
                return cluster
            time.sleep(0.5)
        raise RuntimeError(f"the node never became idle (sinfo: {out!r}); see {root}/slurmd.log")
    except BaseException:
        cluster.stop()
        raise


if __name__ == "__main__":
    c = start(Path(sys.argv[1]))
    print(f"export SLURM_CONF={c.root}/slurm.conf", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        c.stop()
