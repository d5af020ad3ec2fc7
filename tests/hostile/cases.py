"""A catalog of hostile generated environments and what the sandbox must make of each.

Each case is the source of one env. Attacks run inside ``step`` (or at import, or in ``reset``)
and report what happened in the observation: ``escaped...`` when the attack worked, ``blocked:``
plus the exception name when the kernel refused it. ``expect`` lists the acceptable outcomes: a
reason code (docs/architecture.md, 'Reason codes'), ``"blocked"`` (the env ran, the attack was refused), or ``"ok"`` (the env
ran and nothing bad could happen, e.g. a forged frame was ignored). Tokens like ``__PORT__`` are
filled in by the test with host-side targets (loopback listeners, a victim process, a secret).
The test asserts the outcome *and* host-side facts after every case.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    expect: frozenset
    steps: int = 3
    action: str = "go"
    needs: str = ""  # "landlock": in the process tier only Landlock hides the host's files


def _indent(body: str, n: int) -> str:
    return textwrap.indent(textwrap.dedent(body).strip("\n"), " " * n)


def env(step: str = "", reset: str = "", top: str = "",
        ret: str = 'return "obs %d" % self.t, 0.0, self.t >= 3, False, {}') -> str:
    return (f"import gymnasium as gym\n{textwrap.dedent(top).strip()}\n\n"
            "class Hostile(gym.Env):\n"
            "    def reset(self, *, seed=None, options=None):\n"
            "        super().reset(seed=seed)\n        self.t = 0\n"
            f"{_indent(reset, 8)}\n"
            "        return 'start', {}\n\n"
            "    def step(self, action):\n        self.t += 1\n"
            f"{_indent(step, 8)}\n"
            f"        {ret}\n")


def attack(body: str, top: str = "") -> str:
    """An env whose first step tries ``body`` and reports escaped/blocked in its observation."""
    step = ("try:\n" + _indent(body, 4) + "\n    res = 'escaped'\n"
            "except BaseException as e:\n    res = 'blocked:' + type(e).__name__\n"
            "return str(res)[:2000], 0.0, True, False, {}")
    return env(step=step, top=top)


def C(name: str, code: str, *expect: str, steps: int = 3, action: str = "go", needs: str = "") -> Case:
    return Case(name, code, frozenset(expect), steps, action, needs)


CASES = [
    # -- time and resources ------------------------------------------------------------------
    C("infinite_loop", env("while True:\n    pass"), "step_timeout"),
    C("ignore_signals_loop", env("for s in (signal.SIGXCPU, signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
                                 "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass", top="import signal"),
      "step_timeout"),
    C("sleep_forever", env("time.sleep(3600)", top="import time"), "step_timeout"),
    C("sigalrm_defeat", env("signal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.alarm(1)\nwhile True:\n"
                            "    pass", top="import signal"), "step_timeout"),
    C("swallow_base_exception", env("while True:\n    try:\n        while True:\n            pass\n"
                                    "    except BaseException:\n        pass"), "step_timeout"),
    C("memory_bomb", env("x = bytearray(3 << 30)"), "memory_limit"),
    # A leak that outgrows the memory limit over many steps. bytes(n) comes from calloc, which maps
    # zeroed pages without touching them: each step adds 64 MiB of address space (what RLIMIT_AS
    # counts) in microseconds, so the memory limit fires long before any step nears its timeout,
    # however loaded the machine.
    C("slow_leak", env("self.keep = getattr(self, 'keep', []) + [bytes(64 << 20)]",
                       ret="return 'o', 0.0, False, False, {}"), "memory_limit",
      steps=40, action="go"),
    # The same leak writing every page: each step now costs the env real time (tens of ms idle, over
    # half a second on a loaded machine), so which limit fires first depends on the load. Either
    # verdict contains the env; the test holds the host-side facts either way.
    C("slow_leak_resident", env("self.keep = getattr(self, 'keep', []) + [bytearray(64 << 20)]",
                                ret="return 'o', 0.0, False, False, {}"), "memory_limit", "step_timeout",
      steps=40, action="go"),
    C("deep_recursion", env("sys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
                            top="import sys"), "step_timeout", "memory_limit", "crashed", "step_exception"),
    C("fork_bomb", attack("for _ in range(200):\n    os.fork()", top="import os"), "blocked"),
    C("thread_bomb", attack("for _ in range(2000):\n    threading.Thread(target=time.sleep, args=(1000,),"
                            " daemon=True).start()", top="import threading, time"), "blocked"),
    C("fd_bomb", attack("fds = [open('/dev/null') for _ in range(5000)]"), "blocked"),
    C("disk_fill", attack("with open('fill.bin', 'wb') as f:\n    for _ in range(200):\n"
                          "        f.write(b'x' * (1 << 20))"), "blocked"),
    C("print_flood", env("while True:\n    print('x' * 65536)"), "output_flood"),
    C("print_flood_at_import", "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n", "output_flood"),
    C("background_printer", env("threading.Thread(target=lambda: [print('z' * 4096) for _ in iter(int, 1)],"
                                " daemon=True).start()\ntime.sleep(0.05)", top="import threading, time"),
      "output_flood", "ok", steps=6),
    C("raise_rlimits", attack("resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,"
                              " resource.RLIM_INFINITY))", top="import resource"), "blocked"),
    # -- network -------------------------------------------------------------------------------
    C("tcp_connect", attack("socket.create_connection(('127.0.0.1', __TCP_PORT__), timeout=1).send(b'hi')",
                            top="import socket"), "blocked"),
    C("udp_sendto", attack("socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'hi', ('127.0.0.1',"
                           " __UDP_PORT__))", top="import socket"), "blocked"),
    C("unix_path_connect", attack("s = socket.socket(socket.AF_UNIX)\ns.connect('__UNIX_PATH__')\n"
                                  "s.send(b'hi')", top="import socket"), "blocked"),
    C("abstract_unix_connect", attack("s = socket.socket(socket.AF_UNIX)\ns.connect('\\0__ABSTRACT__')\n"
                                      "s.send(b'hi')", top="import socket"), "blocked"),
    C("ipv6_connect", attack("socket.create_connection(('::1', __TCP_PORT__), timeout=1)",
                             top="import socket"), "blocked"),
    # -- secrets and files -----------------------------------------------------------------------
    C("read_passwd", attack("res = open('/etc/passwd').read()\nraise SystemExit(res)"), "blocked", needs="landlock"),
    C("read_secret_file", attack("raise SystemExit('escaped ' + open('__SECRET_FILE__').read())"), "blocked", needs="landlock"),
    C("env_var_secret", env(ret="return 'env:' + repr(dict(os.environ)), 0.0, True, False, {}",
                            top="import os"), "ok"),
    C("proc_environ_scan", attack("found = []\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
                                  "        try:\n            found.append(open(f'/proc/{p}/environ').read())\n"
                                  "        except OSError:\n            pass\n"
                                  "if not any('__SECRET__' in f for f in found):\n"
                                  "    raise PermissionError('nothing readable')\nraise SystemExit('escaped')",
                                  top="import os"), "blocked", needs="landlock"),
    C("append_to_grader", attack("open('__VICTIM_DIR__/grader.py', 'a').write('hacked = True\\n')"), "blocked", needs="landlock"),
    C("create_file_outside", attack("open('__MARKER__', 'w').write('x')"), "blocked", needs="landlock"),
    C("create_file_in_tmp", attack("open('/tmp/spade-hostile-escape', 'w').write('x')"), "blocked", needs="landlock"),
    C("open_gpu_device", attack("open('/dev/nvidia0', 'rb')"), "blocked"),
    C("read_own_workdir_parent", attack("raise SystemExit('escaped ' + repr(os.listdir('..')))",
                                        top="import os"), "blocked", needs="landlock"),
    # -- processes and signals ---------------------------------------------------------------------
    C("subprocess_shell", attack("subprocess.run(['/bin/sh', '-c', 'touch __MARKER__'])",
                                 top="import subprocess"), "blocked"),
    C("posix_spawn", attack("os.posix_spawn('/bin/sh', ['/bin/sh', '-c', 'touch __MARKER__'], {})",
                            top="import os"), "blocked"),
    C("execv", attack("os.execv('/bin/sh', ['/bin/sh', '-c', 'touch __MARKER__'])", top="import os"),
      "blocked"),
    C("fork_exec_audit_bypass", attack("import _posixsubprocess\nos.fork()", top="import os"), "blocked"),
    C("setsid_daemon", attack("if os.fork() == 0:\n    os.setsid()\n    time.sleep(600)",
                              top="import os, time"), "blocked"),
    # In a pid namespace of its own (both tiers as root, the strong tier always) the env's parent
    # is out of sight: getppid() is 0, which kill() would read as "my own group".
    C("kill_parent", attack("ppid = os.getppid()\nif not ppid:\n    raise ProcessLookupError('no parent in sight')\n"
                            "os.kill(ppid, signal.SIGKILL)", top="import os, signal"), "blocked"),
    C("kill_everything", attack("os.kill(-1, signal.SIGKILL)", top="import os, signal"), "blocked"),
    C("kill_victim", attack("os.kill(__VICTIM_PID__, signal.SIGKILL)", top="import os, signal"), "blocked"),
    C("pidfd_victim", attack("signal.pidfd_send_signal(os.pidfd_open(__VICTIM_PID__), signal.SIGKILL)",
                             top="import os, signal"), "blocked"),
    # As pid 1 of its own pid namespace the env's group is 1, and killpg(1) means kill(-1): every
    # process it could signal but itself, i.e. none (ESRCH); without the namespace it dies.
    C("killpg_own_group", env("os.killpg(os.getpgrp(), signal.SIGKILL)", top="import os, signal"), "crashed",
      "step_exception"),
    C("ptrace_parent", attack("libc = ctypes.CDLL(None, use_errno=True)\n"
                              "if libc.ptrace(16, os.getppid(), 0, 0) == -1:\n"
                              "    raise PermissionError(ctypes.get_errno())", top="import ctypes, os"),
      "blocked"),
    C("unshare_userns", attack("libc = ctypes.CDLL(None, use_errno=True)\n"
                               "if libc.unshare(0x10000000) == -1:\n    raise PermissionError()",
                               top="import ctypes"), "blocked"),
    C("mount_tmpfs", attack("libc = ctypes.CDLL(None, use_errno=True)\n"
                            "if libc.mount(b'none', b'.', b'tmpfs', 0, None) == -1:\n    raise PermissionError()",
                            top="import ctypes"), "blocked"),
    C("setuid_root", attack("os.setuid(0)\nos.setgid(0)\nopen('/etc/shadow').read()", top="import os"),
      "blocked"),
    C("tiocsti", attack("fcntl.ioctl(0, termios.TIOCSTI, b'x')", top="import fcntl, termios"), "blocked"),
    C("segfault", env("ctypes.string_at(0)", top="import ctypes"), "crashed"),
    C("os_exit_midway", env("if self.t == 2:\n    os._exit(0)", top="import os"), "exited_early"),
    C("sys_exit_in_step", env("sys.exit(3)", top="import sys"), "step_exception"),
    C("close_protocol_fds", env("for fd in range(3, 64):\n    try:\n        os.close(fd)\n"
                                "    except OSError:\n        pass", top="import os"), "exited_early", "crashed"),
    C("forge_frames_on_stdout", env("sys.stdout.buffer.write(struct.pack('>I', 9) + b'\\x81\\xa2ok\\xc3' * 3)\n"
                                    "sys.stdout.flush()", top="import sys, struct"), "ok"),
    C("forge_frame_on_protocol", env("import msgpack\nbody = msgpack.packb({'ok': True, 'obs': 12345})\n"
                                     "for fd in range(3, 16):\n    try:\n"
                                     "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
                                     "            os.write(fd, struct.pack('>I', len(body)) + body)\n"
                                     "    except OSError:\n        pass",
                                     top="import os, stat, struct"), "sandbox_violation"),  # an untyped frame; the worker ends
    # -- contract violations ---------------------------------------------------------------------
    C("reward_nan", env(ret="return 'o', float('nan'), False, False, {}"), "reward_not_finite"),
    C("reward_inf", env(ret="return 'o', float('inf'), False, False, {}"), "reward_not_finite"),
    C("reward_str", env(ret="return 'o', '1.0', False, False, {}"), "reward_not_real"),
    C("reward_none", env(ret="return 'o', None, False, False, {}"), "reward_not_real"),
    C("reward_bool", env(ret="return 'o', True, False, False, {}"), "reward_not_real"),
    C("reward_evil_float", env(ret="return 'o', Evil(0.5), True, False, {}",
                               top="class Evil(float):\n    def __eq__(self, o):\n        return True\n"
                                   "    def __repr__(self):\n        return '__import__(\"os\").system(\"id\")'"),
      "ok"),
    C("obs_dict", env(ret="return {'a': 1}, 0.0, False, False, {}"), "obs_not_str"),
    C("obs_bytes", env(ret="return b'abc', 0.0, False, False, {}"), "obs_not_str"),
    # 128 times the observation cap: building it costs the env a few ms, where 50 MiB took over a
    # third of the step timeout on a loaded machine and raced it.
    C("obs_8mb", env(ret="return 'x' * (8 << 20), 0.0, False, False, {}"), "obs_too_large"),
    C("obs_lone_surrogate", env(ret="return 'a\\ud800b', 0.0, False, False, {}"), "obs_not_str"),
    C("step_4_tuple", env(ret="return 'o', 0.0, False, {}"), "step_bad_return"),
    C("reset_obs_only", env(ret="return 'o', 0.0, True, False, {}").replace("return 'start', {}", "return 'start'"),
      "reset_bad_return"),
    C("flags_int", env(ret="return 'o', 0.0, 0, False, {}"), "flags_not_bool"),
    C("flags_none", env(ret="return 'o', 0.0, False, None, {}"), "flags_not_bool"),
    C("info_object", env(ret="return 'o', 0.0, False, False, {'x': object()}"), "info_not_json"),
    C("info_nan", env(ret="return 'o', 0.0, False, False, {'x': float('nan')}"), "info_not_json"),
    C("info_huge", env(ret="return 'o', 0.0, False, False, {'x': 'y' * (2 << 20)}"), "obs_too_large",
      "info_not_json"),
    C("step_raises_at_3", env("if self.t == 3:\n    raise RuntimeError('boom')"), "step_exception"),
    C("reset_raises", env(reset="raise ValueError('bad reset')"), "reset_exception"),
    C("import_missing_module", "import torch_not_installed_pkg\n", "import_error"),
    C("import_raises", "raise RuntimeError('at import')\n", "import_error"),
    C("syntax_error", "class (:\n", "syntax_error"),
    C("no_env_class", "x = 1\n", "no_env_class"),
    C("two_env_classes", env() + "\nclass Other(gym.Env):\n    pass\n", "no_env_class"),
    C("huge_action_echo", env(ret="return 'len=%d' % len(action), 0.0, True, False, {}"), "ok",
      action="\x00" + "A" * (10 << 20) + "\ud800"),
    C("monkeypatch_shared_module", env("random.Random.randint = lambda self, a, b: 7\n"
                                       "builtins.len = lambda x: 0", top="import builtins, random"),
      "ok", "sandbox_violation", "step_bad_return"),  # it may break its own process (the arity
    # check runs with its len), never another
]
