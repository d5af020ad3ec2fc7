"""Kernel confinement that an env process applies to itself right after the zygote forks it.

Order matters and is fixed: own session, rlimits, private cwd, unprivileged uid (when root),
``PR_SET_NO_NEW_PRIVS``, parent-death signal, Landlock, seccomp last (so the earlier steps may
still use the syscalls seccomp removes). Nothing here is an in-interpreter guard: each layer is
enforced by the kernel and survives anything the env's Python code does afterwards.

* rlimits: CPU (hard = soft + 1 s, so SIGKILL follows an ignored SIGXCPU), AS, FSIZE, NOFILE,
  CORE 0, and NPROC when not root (the kernel ignores it for uid 0).
* seccomp: a classic-BPF filter built here from syscall tables for x86_64 and aarch64 (no
  libseccomp needed, nothing to import): no ``socket`` (``socketpair`` stays), no fork/exec, only
  threads may ``clone``, ``clone3`` answers ENOSYS so glibc falls back to ``clone``, no ptrace,
  mount, namespaces, bpf, keyrings, io_uring, modules, and ``kill``/``tgkill`` only at itself.
* Landlock (raw syscalls 444-446, the same number on every architecture): read-only access to
  the interpreter and libraries, read-write access to the env's private dir only; on ABI >= 4
  no TCP bind/connect; on ABI >= 6 no signals or abstract unix sockets outside the sandbox.

Every function raises ``ConfineError`` when a layer that was asked for cannot be applied: a
setup failure must abort the run as an infrastructure error, never look like a bad env.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import resource
import struct

NOBODY = 65534


class ConfineError(Exception):
    """A confinement layer that was requested could not be applied."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 38, 22, 36
SECCOMP_MODE_FILTER = 2


def prctl(option: int, arg: int = 0) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise ConfineError(f"prctl({option}) failed: {os.strerror(err)}")


# -- rlimits and identity ----------------------------------------------------------------------

def apply_rlimits(cpu_s: int, memory_mb: int, fsize_mb: int, nofile: int, nproc: int | None) -> None:
    limits = [
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
        (resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20)),
        (resource.RLIMIT_FSIZE, (fsize_mb << 20, fsize_mb << 20)),
        (resource.RLIMIT_NOFILE, (nofile, nofile)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if nproc is not None:
        limits.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    for which, (soft, hard) in limits:
        cur_soft, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:  # never ask for more than we have: that raises
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            raise ConfineError(f"setrlimit({which}) failed: {exc}") from None


# Env processes as root become uid/gid ENV_UID_BASE + a number the zygote draws at random among
# those no live env holds: a uid no account uses, so the process owns no file and no other process
# on the host (not even another env's), and kernel checks by uid (signals, ptrace, /proc, prlimit)
# see a stranger. Not the pid: pids count up, and the uid would tell an env how many episodes ran
# before it.
ENV_UID_BASE = 1 << 30
ENV_UIDS = 1 << 22


def env_uid(n: int) -> int:
    return ENV_UID_BASE + n % ENV_UIDS


PR_SET_KEEPCAPS, CAP_DAC_READ_SEARCH = 8, 2


def drop_privileges(workdir: str, uid: int, keep_read_search: bool = False) -> bool:
    """As root: become ``uid`` (after handing it the private dir). Returns whether uid changed.

    ``keep_read_search`` keeps CAP_DAC_READ_SEARCH and nothing else, for an interpreter that only
    root can reach (pyenv under /root): Landlock, applied next, is then what limits reads, to the
    same runtime paths it allows anyway. Only used when Landlock is active.
    """
    if os.geteuid() != 0:
        return False
    try:
        os.chown(workdir, uid, uid)
        os.setgroups([])
        if keep_read_search:
            prctl(PR_SET_KEEPCAPS, 1)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise ConfineError(f"dropping to uid {uid} failed: {exc}") from None
    if keep_read_search:
        _capset(1 << CAP_DAC_READ_SEARCH)
    return True


CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000


def own_pid_namespace() -> int | None:
    """An fd of the caller's pid namespace when it may make new ones (CAP_SYS_ADMIN), else None."""
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if not new_pid_namespace(fd):
        os.close(fd)
        return None
    same_pid_namespace(fd)
    return fd


def new_pid_namespace(own_fd: int) -> bool:
    """Make the caller's next child pid 1 of a pid namespace of its own (the caller stays where it
    is; ``setns(own_fd)`` first, since a namespace takes only its first child as init)."""
    return _libc.setns(own_fd, CLONE_NEWPID) == 0 and _libc.unshare(CLONE_NEWPID) == 0


def same_pid_namespace(own_fd: int) -> None:
    """Children forked from now on share the caller's pid namespace again."""
    _libc.setns(own_fd, CLONE_NEWPID)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18


def private_scratch(workdir: str, scratch_mb: int, uid: int) -> str | None:
    """Own mount and IPC namespaces with a size-capped tmpfs owned by ``uid`` for a working dir;
    returns that dir's path, or None (changing nothing) where CAP_SYS_ADMIN is missing (it needs
    root, or the zygote inside bubblewrap's user namespace).

    The tmpfs lives only in this process's mount namespace, so its pages are freed when the
    process ends, however it ends; the IPC namespace leaves the env no SysV object of anyone else
    to open even if seccomp were absent. The dir every env gets is the same path, ``env`` in a
    tmpfs laid over the parent of ``workdir``: the host's parent holds one dir per live env process,
    and its link count (``stat`` needs no Landlock right) would tell an env how many run beside it.
    """
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
        return None
    # Our copy of the mount table must not propagate back to the host's shared mounts.
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise ConfineError(f"making mounts private failed: {os.strerror(ctypes.get_errno())}")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    parent = os.path.dirname(workdir)
    if _libc.mount(b"spade-envs", parent.encode(), b"tmpfs", flags, b"size=16k,nr_inodes=8,mode=0755") != 0:
        raise ConfineError(f"mounting over the envs' parent dir failed: {os.strerror(ctypes.get_errno())}")
    own = os.path.join(parent, "env")
    os.mkdir(own)
    opts = f"size={scratch_mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    if _libc.mount(b"spade-scratch", own.encode(), b"tmpfs", flags, opts) != 0:
        raise ConfineError(f"mounting the scratch tmpfs failed: {os.strerror(ctypes.get_errno())}")
    if os.getpid() == 1:
        # pid 1 of a pid namespace of its own: a /proc of that namespace, where no other process
        # exists. Landlock already refuses reads of the old one, but not ``stat``: its pid dirs,
        # and their thread counts in ``st_nlink``, gave position and a channel between envs.
        # Best effort (a user namespace may refuse a new proc where parts of the old are hidden).
        _libc.mount(b"proc", b"/proc", b"proc", flags, None)
    return own


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Stay uid 0 but hold no capability: used when nobody could not even read the interpreter.

    Without CAP_DAC_OVERRIDE, CAP_KILL, CAP_SYS_PTRACE, CAP_SETUID and the rest, root is an
    ordinary owner of root's files; Landlock (applied next) is what keeps it off them.
    """
    PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP = 47, 4, 24
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    _capset(0)


def _capset(mask: int) -> None:
    """Effective and permitted capabilities become exactly ``mask`` (inheritable none)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = mask & 0xFFFFFFFF
    data[1].effective = data[1].permitted = mask >> 32
    SYS_capset = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
    if SYS_capset is None or _libc.syscall(SYS_capset, ctypes.byref(header), ctypes.byref(data)) != 0:
        raise ConfineError(f"capset failed: {os.strerror(ctypes.get_errno())}")


def readable_by_others(paths: list[str]) -> bool:
    """Whether every directory on the way to each path lets other users in (r-x for o)."""
    for path in paths:
        p = os.path.realpath(path)
        while True:
            try:
                mode = os.stat(p).st_mode
            except OSError:
                return False
            if not mode & 0o001 or (p == os.path.realpath(path) and not mode & 0o004):
                return False
            if p == "/":
                break
            p = os.path.dirname(p)
    return True


# -- seccomp ------------------------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name -> (x86_64 number, aarch64 number); None where the architecture has no such call.
SYSCALLS = {
    "socket": (41, 198), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "unshare": (272, 97), "setns": (308, 268),
    "bpf": (321, 280), "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "fork": (57, None), "vfork": (58, None), "execve": (59, 221),
    "execveat": (322, 281), "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424),
    "pidfd_getfd": (438, 438), "tkill": (200, 130), "personality": (135, 92), "acct": (163, 89),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "sethostname": (170, 161), "setdomainname": (171, 162),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "quotactl": (179, 60),
    "mknod": (133, None), "mknodat": (259, 33), "fanotify_init": (300, 262),
    "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "process_madvise": (440, 440), "syslog": (103, 116),
    "vhangup": (153, 58),
    # Reach into other processes' scheduling, memory or kernel objects: never needed by an env.
    "setpriority": (141, 140), "ioprio_set": (251, 30), "migrate_pages": (256, 238),
    "move_pages": (279, 239), "kcmp": (312, 272), "get_robust_list": (274, 100),
    # SysV IPC and POSIX message queues: kernel objects that outlive the process and that any
    # process of the namespace can open by key or name, i.e. a channel between envs.
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    # Watches on shared files and dirs (the stdlib, the parent of the working dirs): Landlock does
    # not cover them, so two envs could signal each other by opening files, or watch episodes'
    # dirs come and go.
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
    # Anonymous files: each holds up to RLIMIT_FSIZE outside RLIMIT_AS and the scratch quota, and
    # fds parked in flight on a socketpair escape RLIMIT_NOFILE: gigabytes of host memory.
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
    # handled specially below: allowed on the calling process only (pid 0 or its own pid)
    "prlimit64": (302, 261), "sched_setaffinity": (203, 122), "sched_setparam": (142, 118),
    "sched_setscheduler": (144, 119), "sched_setattr": (314, 274),
    # handled specially below
    "kill": (62, 129), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240), "ioctl": (16, 29), "clone": (56, 220), "clone3": (435, 435),
}
SELF_ONLY = ("prlimit64", "sched_setaffinity", "sched_setparam", "sched_setscheduler", "sched_setattr")
SPECIAL = {"kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "ioctl", "clone", "clone3", *SELF_ONLY}
RET_ALLOW, RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 1, 38
CLONE_THREAD = 0x00010000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# classic BPF opcodes
LD_W_ABS, JEQ_K, JSET_K, RET_K, JGE_K = 0x20, 0x15, 0x45, 0x06, 0x35


def _errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


def _arch() -> tuple[str, int]:
    machine = platform.machine()
    if machine not in AUDIT_ARCH:
        raise ConfineError(f"no seccomp syscall table for {machine}")
    return machine, 0 if machine == "x86_64" else 1


def build_filter(my_pid: int) -> bytes:
    """The env-process seccomp program as packed ``struct sock_filter`` entries."""
    machine, col = _arch()
    prog: list[tuple[int, int, int, int]] = []

    def ins(code: int, k: int, jt: int = 0, jf: int = 0) -> None:
        prog.append((code, jt, jf, k & 0xFFFFFFFF))

    ins(LD_W_ABS, 4)  # arch
    ins(JEQ_K, AUDIT_ARCH[machine], 1, 0)
    ins(RET_K, RET_KILL_PROCESS)
    ins(LD_W_ABS, 0)  # nr
    if machine == "x86_64":  # x32 ABI numbers would dodge every rule below
        ins(JGE_K, 0x40000000, 0, 1)
        ins(RET_K, _errno(EPERM))
    for name, nums in SYSCALLS.items():
        nr = nums[col]
        if nr is None or name in SPECIAL:
            continue
        ins(JEQ_K, nr, 0, 1)
        ins(RET_K, _errno(EPERM))

    def block(nr: int, body: list[tuple[int, int, int, int]]) -> None:
        ins(JEQ_K, nr, 0, len(body))
        prog.extend(body)

    def b(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
        return (code, jt, jf, k & 0xFFFFFFFF)

    # Argument words are loaded at offset 16 + 8 * i: the low 32 bits on little-endian machines,
    # which is where pids, flags and ioctl requests live.
    allow_self = [0, my_pid, -my_pid]
    # kill(pid): only itself or its own process group (it is a session leader)
    block(SYSCALLS["kill"][col], [b(LD_W_ABS, 16), b(JEQ_K, allow_self[0], 3, 0),
                                  b(JEQ_K, allow_self[1], 2, 0), b(JEQ_K, allow_self[2], 1, 0),
                                  b(RET_K, _errno(EPERM)), b(RET_K, RET_ALLOW)])
    # prlimit64 and the scheduler setters take a pid: 0 or its own, never the zygote's or a
    # neighbour's (RLIMIT_NOFILE=4 on the zygote would stop every other env of the run)
    for name in SELF_ONLY:
        block(SYSCALLS[name][col], [b(LD_W_ABS, 16), b(JEQ_K, 0, 2, 0), b(JEQ_K, my_pid, 1, 0),
                                    b(RET_K, _errno(EPERM)), b(RET_K, RET_ALLOW)])
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        block(SYSCALLS[name][col], [b(LD_W_ABS, 16), b(JEQ_K, my_pid, 1, 0),
                                    b(RET_K, _errno(EPERM)), b(RET_K, RET_ALLOW)])
    # ioctl: no terminal injection (TIOCSTI/TIOCLINUX), compared on the low 32 bits
    block(SYSCALLS["ioctl"][col], [b(LD_W_ABS, 24), b(JEQ_K, TIOCSTI, 1, 0), b(JEQ_K, TIOCLINUX, 0, 1),
                                   b(RET_K, _errno(EPERM)), b(RET_K, RET_ALLOW)])
    # clone: threads yes, processes no
    block(SYSCALLS["clone"][col], [b(LD_W_ABS, 16), b(JSET_K, CLONE_THREAD, 1, 0),
                                   b(RET_K, _errno(EPERM)), b(RET_K, RET_ALLOW)])
    block(SYSCALLS["clone3"][col], [b(RET_K, _errno(ENOSYS))])
    ins(RET_K, RET_ALLOW)
    if len(prog) > 4096:
        raise ConfineError("seccomp program too long")
    return b"".join(struct.pack("HBBI", *p) for p in prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PID_MARK = 0x3FFFFFF7  # a pid no kernel hands out (pid_max <= 2**22): marks the pid slots


@functools.lru_cache(maxsize=1)
def _filter_template() -> tuple[bytes, bytes, bytes]:
    """The filter built once (in the zygote) with a marker pid, and the marker's two encodings."""
    return (build_filter(_PID_MARK), struct.pack("I", _PID_MARK), struct.pack("I", -_PID_MARK & 0xFFFFFFFF))


def filter_for(my_pid: int) -> bytes:
    """``build_filter(my_pid)`` without rebuilding it: an env process starts in microseconds."""
    code, mark, neg = _filter_template()
    return code.replace(mark, struct.pack("I", my_pid)).replace(neg, struct.pack("I", -my_pid & 0xFFFFFFFF))


def apply_seccomp(my_pid: int) -> None:
    code = filter_for(my_pid)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise ConfineError(f"loading the seccomp filter failed: {os.strerror(ctypes.get_errno())}")


# -- Landlock -----------------------------------------------------------------------------------

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# access-right bits per ABI (fs): 1..13 bits for ABI 1, +REFER (ABI 2), +TRUNCATE (3), +IOCTL_DEV (5)
FS_READ = 0x1 | 0x4 | 0x8  # EXECUTE, READ_FILE, READ_DIR
FS_ABI_BITS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when absent or disabled."""
    n = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(n), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def apply_landlock(read_paths: list[str], write_paths: list[str]) -> int:
    """Restrict the filesystem (and TCP, signals, abstract sockets where supported); returns the ABI."""
    abi = landlock_abi()
    if abi < 1:
        raise ConfineError("Landlock is not available")
    fs_all = FS_ABI_BITS[max(k for k in FS_ABI_BITS if k <= abi)]
    attr = _RulesetAttr(fs_all, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rfd = _libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if rfd < 0:
        raise ConfineError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        for paths, access in ((read_paths, FS_READ), (write_paths, fs_all)):
            for path in paths:
                try:
                    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a missing optional path (e.g. /lib64) is not an error
                try:
                    mask = access if os.path.isdir(path) else access & ~(0x8 | 0x10 | 0x20 | 0x40 | 0x80
                                                                         | 0x100 | 0x200 | 0x400 | 0x800
                                                                         | 0x1000 | 0x2000)
                    rule = _PathBeneath(mask, pfd)
                    if _libc.syscall(SYS_ADD_RULE, rfd, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                        raise ConfineError(f"landlock_add_rule({path}) failed: "
                                           f"{os.strerror(ctypes.get_errno())}")
                finally:
                    os.close(pfd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _libc.syscall(SYS_RESTRICT_SELF, rfd, 0) != 0:
            raise ConfineError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(rfd)
    return abi
