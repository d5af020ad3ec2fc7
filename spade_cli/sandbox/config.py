"""The sandbox's shared types: its settings, its reason codes and its two errors.

A leaf module: the supervisor, the env workers and the probes all import it, and it imports none of
them, so no import has to wait inside a function to break a cycle. The reason codes are the
contract's (docs/architecture.md, 'Reason codes').
"""

from __future__ import annotations

from dataclasses import dataclass, field

REASONS = frozenset(
    "no_code syntax_error no_env_class too_large import_error import_timeout reset_exception "
    "reset_bad_return step_exception step_bad_return step_timeout obs_not_str obs_too_large "
    "reward_not_finite reward_not_real flags_not_bool info_not_json memory_limit output_flood crashed "
    "exited_early nondeterministic return_out_of_range hint_leak no_hint trivial duplicate "
    "sandbox_violation disk_limit hint_is_answer format_only".split()
)
TIERS = ("process", "strong")


class EnvError(Exception):
    """An env misbehaved. ``reason`` is a reason code (docs/architecture.md, 'Reason codes'), ``detail`` a short human sentence."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class SandboxUnavailable(RuntimeError):
    """The sandbox itself cannot run here (or not at the required tier): an infrastructure error."""


@dataclass
class SandboxConfig:
    tier: str = "auto"                # auto | process | strong
    min_tier: str = "process"         # fail closed below this
    import_timeout_s: float = 3.0
    reset_timeout_s: float = 2.0
    step_timeout_s: float = 1.0
    episode_timeout_s: float = 60.0   # env time (reset + steps) per episode, not model time
    memory_mb: int = 1024             # RLIMIT_AS of an env process
    cpu_s: int = 300                  # RLIMIT_CPU backstop over a worker's whole life
    fsize_mb: int = 16
    nofile: int = 64
    nproc: int = 1024                 # per uid, threads included; fork is denied by seccomp anyway
    max_obs_chars: int = 65536
    max_action_chars: int = 16384     # longer agent actions are truncated before `step`
    max_output_bytes: int = 1 << 20   # env stdout+stderr per worker before `output_flood`
    max_code_chars: int = 200_000
    scratch_mb: int = 64              # total size of an env's working dir (tmpfs size= or a checked budget)
    seccomp: bool = True
    landlock: bool = True
    extra_warnings: list[str] = field(default_factory=list)
    preimport: tuple[str, ...] = ()   # heavy trusted libraries the zygote imports once (see heavy_imports)

    @property
    def max_frame(self) -> int:
        # Not derived from rollout's shorter action cap alone: the env process holds this number,
        # and it must not differ between validation and rollout.
        return 4 * (self.max_obs_chars + max(self.max_action_chars, 16384)) + (256 << 10)
