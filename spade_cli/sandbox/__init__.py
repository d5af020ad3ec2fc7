"""The sandbox that runs generated environments (docs/architecture.md, 'Sandbox'): one confined OS process per episode.

Public API (used by ``spade validate`` and ``spade rollout``)::

    from spade_cli.sandbox import SandboxConfig, SandboxPool, EnvError

    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        env = pool.open(code, env_id)                 # EnvError(import_error, ...) if it won't load
        obs, info = env.reset("ep-0", seed=7)         # a fresh process for this episode
        obs, r, term, trunc, info = env.step("ep-0", "my move")
        env.close_episode("ep-0")

Modules: ``config`` (settings, reason codes, errors), ``supervisor`` (the pool, the tier),
``zygote`` (the handle on a fork server), ``envworker`` (one source's episode processes,
deadlines, untrusted replies), ``worker`` (the zygote), ``envproc`` (the env process),
``confine`` (rlimits, uid, scratch tmpfs, seccomp, Landlock), ``protocol`` (typed msgpack frames),
``checks`` (every value check, shared by the env process, the supervisor, validate and rollout),
``probe`` (what works here; tier choice). See docs/sandbox.md.
"""

from spade_cli.sandbox.envworker import EnvWorker
from spade_cli.sandbox.supervisor import (
    REASONS,
    EnvError,
    SandboxConfig,
    SandboxPool,
    SandboxUnavailable,
)

__all__ = ["REASONS", "EnvError", "EnvWorker", "SandboxConfig", "SandboxPool", "SandboxUnavailable"]
