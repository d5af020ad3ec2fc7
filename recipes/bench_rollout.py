"""Benchmark of `spade rollout`'s engine: batching, orchestration overhead, sandbox share.

Plays ``--envs`` environments x ``--k`` pairs (2k episodes each) with the hf backend and the real
sandbox, then prints, from the same run:

* backend calls per turn: ``generate`` calls / lockstep ticks (must be 1 for hf when the whole
  batch fits one call);
* orchestration overhead per episode-turn, excluding generation and env steps (rendering,
  tokenizing, bookkeeping), as a ratio against the generation time per episode-turn;
* the sandbox's share of rollout wall time (the zygote's start, once per stage, is timed and
  printed apart), and the cost of a sandboxed env step as a ratio against
  the same env stepped in-process (a baseline measured in the same run).

As in ``spade rollout``, the first tick's env processes are forked ahead while the model loads
(here a ``--model-load-s`` pause stands in for the load; ``--no-prefork`` is the baseline without).
The tiny model generates in microseconds, so its sandbox share is an upper bound; ``--size small``
gives a model closer to real proportions. Example::

    .venv/bin/python recipes/bench_rollout.py --envs 8 --k 4 --max-turns 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

GUESS = '''
import gymnasium as gym

class Guess(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(0, 10))
        self.t = 0
        return "Guess a digit from 0 to 9 (variant VARIANT).", {}

    def step(self, action):
        self.t += 1
        digits = [c for c in action if c.isdigit()]
        if digits and int(digits[0]) == self.target:
            return "correct", 1.0, True, False, {}
        return f"wrong (turn {self.t})", 0.0, False, False, {}
'''


class InProcessPool:
    """Baseline: the same env classes stepped in this interpreter (no isolation at all)."""

    tier = "none"

    class Worker:
        alive = True

        def __init__(self, code: str):
            import gymnasium as gym

            ns: dict = {}
            exec(code, ns)
            self.cls = next(v for v in ns.values() if isinstance(v, type) and issubclass(v, gym.Env)
                            and v is not gym.Env)
            self.envs: dict = {}

        def reset(self, episode_id: str, seed: int):
            self.envs[episode_id] = self.cls()
            return self.envs[episode_id].reset(seed=seed)

        def step(self, episode_id: str, action: str):
            return self.envs[episode_id].step(action)

        def close_episode(self, episode_id: str) -> None:
            self.envs.pop(episode_id, None)

        def close(self) -> None:
            pass

    def open(self, code: str, env_id: str):
        return self.Worker(code)

    def close(self) -> None:
        pass


def play(backend, pool, envs, args, env_error):
    from spade_cli.rollout.episodes import Engine, PlayConfig, episode_specs

    cfg = PlayConfig(max_turns=args.max_turns, max_tokens=args.max_tokens, max_concurrent=4096,
                     max_episode_tokens=100_000, seed=0)
    rows: list = []
    calls0 = backend.calls
    t0 = time.perf_counter()
    stats = Engine(backend, pool, envs, cfg, rows.append, env_error=env_error).run(
        episode_specs(list(envs), args.k, run_seed=0, iteration=0))
    wall = time.perf_counter() - t0
    return stats, wall, backend.calls - calls0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", dest="max_tokens", metavar="N", type=int, default=16,
                    help="token cap of one reply, as in spade rollout")
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--model-load-s", type=float, default=1.0,
                    help="pause after the sandbox's start, standing in for the model load it overlaps")
    ap.add_argument("--no-prefork", action="store_true",
                    help="the baseline: no env processes forked ahead for the first tick")
    args = ap.parse_args()

    from spade_cli.backends import load_backend
    from spade_cli.core.records import env_id_for
    from spade_cli.models import tinymodel
    from spade_cli.rollout.episodes import EnvSource
    from spade_cli.sandbox import EnvError, SandboxConfig, SandboxPool

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        tinymodel.build(model, size=args.size)
        episodes = 2 * args.k * args.envs
        backend = load_backend("hf", str(model), batch_size=episodes)
        envs = {}
        for i in range(args.envs):
            code = GUESS.replace("VARIANT", str(i))
            envs[env_id_for(code, "h")] = EnvSource(env_id_for(code, "h"), code, "a hint")

        play(backend, InProcessPool(), envs, args, EnvError)  # warm-up: kernels, allocator
        pool = SandboxPool(SandboxConfig())
        t_zygote = time.perf_counter()
        # Once per stage, overlapped with loading the model in a real stage: the zygote starts and
        # forks the first tick's env processes, which confine themselves while the model loads.
        pool.prestart((0,), episodes=0 if args.no_prefork else episodes)
        t_zygote = time.perf_counter() - t_zygote
        time.sleep(args.model_load_s)  # stands in for the model load that the stage overlaps it with
        try:
            s, wall, calls = play(backend, pool, envs, args, EnvError)
        finally:
            pool.close()
        b, bwall, _ = play(backend, InProcessPool(), envs, args, EnvError)

    turns = max(s.turns, 1)
    gen_per_turn = s.gen_s / turns
    orch = max(wall - s.gen_s - s.env_s, 0.0)
    step_sandbox = s.env_s / max(s.env_steps, 1)
    step_inproc = b.env_s / max(b.env_steps, 1)
    print(f"model {args.size}, {len(envs)} envs x {args.k} pairs = {episodes} episodes, "
          f"{s.turns} episode-turns in {s.ticks} ticks, wall {wall:.2f} s (tier {pool.tier})")
    print(f"backend calls per turn (hf):                  {calls / max(s.ticks, 1):.2f}  ({calls} calls, {s.ticks} ticks)")
    print(f"generation per episode-turn (baseline):       {1e3 * gen_per_turn:.3f} ms")
    print(f"orchestration per episode-turn (no gen/env):  {1e3 * orch / turns:.3f} ms  "
          f"= {orch / max(s.gen_s, 1e-9):.3f} x generation")
    print(f"sandbox share of rollout wall time:           {100 * s.env_s / wall:.2f} %  "
          f"(zygote start, once per stage, not in it: {t_zygote:.2f} s; "
          f"{'no prefork' if args.no_prefork else f'{episodes} env processes forked ahead'})")
    print(f"env phase per episode-turn, sandbox vs in-process: {1e3 * step_sandbox:.3f} ms vs "
          f"{1e3 * step_inproc:.3f} ms = {step_sandbox / max(step_inproc, 1e-9):.1f} x")
    print(f"in-process run for comparison: wall {bwall:.2f} s, generation {b.gen_s:.2f} s")


if __name__ == "__main__":
    main()
