"""The sandbox that runs generated environments (DESIGN §5): one confined OS process per source.

Public API (used by ``spade validate`` and ``spade rollout``)::

    from spade_cli.sandbox import SandboxConfig, SandboxPool, EnvError

    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        env = pool.open(code, env_id)                 # EnvError(import_error, ...) if it won't load
        obs, info = env.reset("ep-0", seed=7)         # a fresh env instance for this episode
        obs, r, term, trunc, info = env.step("ep-0", "my move")
        env.close_episode("ep-0")

Modules: ``supervisor`` (pool, workers, deadlines), ``worker`` (zygote and env process),
``confine`` (rlimits, uid drop, seccomp, Landlock), ``protocol`` (msgpack frames), ``probe``
(what works here; tier choice). See docs/sandbox.md.
"""

from spade_cli.sandbox.supervisor import (
    REASONS,
    EnvError,
    EnvWorker,
    SandboxConfig,
    SandboxPool,
    SandboxUnavailable,
)

__all__ = ["REASONS", "EnvError", "EnvWorker", "SandboxConfig", "SandboxPool", "SandboxUnavailable"]
