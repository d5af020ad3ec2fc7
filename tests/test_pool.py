"""The bundled example pool: every environment is solvable, not trivial, deterministic, leak-free,
and passes the real `spade validate`; reasoning-gym pools are scored by reasoning-gym.

Solvability is shown by a scripted solver per environment that reaches return 1 through
``step`` alone. Some solvers read the environment's own state to choose their actions (an oracle):
that proves an action sequence with return 1 exists, which is what "solvable" means here.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import re
import string
from collections import deque
from fractions import Fraction
from math import lcm

import gymnasium as gym
import pytest

from spade_cli.envs import pool
from tests.conftest import run_spade

NAMES = sorted(p.stem for p in pool.BUNDLED_POOL.glob("*.py"))
SEEDS = [0, 1, 2]


def load_env(name: str) -> gym.Env:
    code = (pool.BUNDLED_POOL / f"{name}.py").read_text()
    ns: dict = {"__name__": f"pool_{name}"}
    exec(compile(code, f"{name}.py", "exec"), ns)
    classes = [v for v in ns.values() if isinstance(v, type) and issubclass(v, gym.Env) and v is not gym.Env]
    assert len(classes) == 1, f"{name}: expected one gymnasium.Env subclass, got {classes}"
    return classes[0]()


def call(**kw: object) -> str:
    return json.dumps(kw)


# -- solvers: generators of actions; each receives the env (oracle state) and the last observation --

def solve_ledger(env, obs):
    obs = yield call(tool="ledger")
    ledger = json.loads(obs)
    refs = [e["ref"] for e in ledger]
    for line in env.statement:
        if line["ref"] not in refs:
            obs = yield call(tool="book", ref=line["ref"])
    seen = set()
    for e in ledger:
        if e["ref"] in seen:
            obs = yield call(tool="delete", entry=e["entry"])
        seen.add(e["ref"])
    yield call(tool="submit")


def solve_inventory(env, obs):
    status = json.loads((yield call(tool="stock")))
    for sku, s in status.items():
        prices = json.loads((yield call(tool="quote", sku=sku)))
        best = min(sorted(prices), key=lambda k: prices[k])
        yield call(tool="order", sku=sku, supplier=best, qty=s["target"] - s["stock"])
    yield call(tool="close")


def solve_calendar(env, obs):
    meetings = json.loads((yield call(tool="meetings")))
    busy = {}
    for p in sorted({p for who in meetings.values() for p in who}):
        busy[p] = {tuple(s) for s in json.loads((yield call(tool="busy", person=p)))}
    slots = [(d, h) for d in ["mon", "tue", "wed", "thu", "fri"] for h in range(9, 17)]

    def search(i, used):
        if i == len(meetings):
            return {}
        m = sorted(meetings)[i]
        for s in slots:
            if all(s not in busy[p] and (p, s) not in used for p in meetings[m]):
                rest = search(i + 1, used | {(p, s) for p in meetings[m]})
                if rest is not None:
                    return {m: s, **rest}
        return None

    for m, (d, h) in sorted(search(0, frozenset()).items()):
        yield call(tool="book", meeting=m, day=d, hour=h)
    yield call(tool="done")


def solve_mastermind(env, obs):
    from_letters = "ABCDEF"
    cands = ["".join(c) for c in itertools.product(from_letters, repeat=4)]

    def score(code, guess):
        exact = sum(a == b for a, b in zip(code, guess, strict=True))
        return exact, sum(min(code.count(c), guess.count(c)) for c in from_letters) - exact

    guess = "AABB"
    while True:
        obs = yield f"GUESS {guess}"
        m = re.search(r"exact (\d)(?:, near (\d))?", obs)
        fb = (int(m.group(1)), int(m.group(2) or 0))
        cands = [c for c in cands if score(c, guess) == fb]
        guess = cands[0]


def solve_jugs(env, obs):
    caps, start = env.caps, (0, 0, 0)
    prev = {start: None}
    q = deque([start])
    while q:
        s = q.popleft()
        if env.target in s:
            break
        for i in range(3):
            moves = [(f"fill {'abc'[i]}", tuple(caps[k] if k == i else s[k] for k in range(3))),
                     (f"empty {'abc'[i]}", tuple(0 if k == i else s[k] for k in range(3)))]
            for j in range(3):
                if i != j:
                    a = min(s[i], caps[j] - s[j])
                    moves.append((f"pour {'abc'[i]} {'abc'[j]}",
                                  tuple(s[k] - a if k == i else s[k] + a if k == j else s[k] for k in range(3))))
            for name, t in moves:
                if t not in prev:
                    prev[t] = (s, name)
                    q.append(t)
    plan = []
    while prev[s] is not None:
        s, name = prev[s]
        plan.append(name)
    for name in reversed(plan):
        yield name


def _path(roads, a, b):
    best, heap = {a: (0, [a])}, [(0, a, [a])]
    while heap:
        d, u, p = heapq.heappop(heap)
        if u == b:
            return p
        for v, w in sorted(roads[u].items()):
            if d + w < best.get(v, (10**9,))[0]:
                best[v] = (d + w, p + [v])
                heapq.heappush(heap, (d + w, v, p + [v]))
    raise AssertionError("disconnected map")


def solve_courier(env, obs):
    def length(p):
        return sum(env.roads[x][y] for x, y in itertools.pairwise(p))

    tours = []
    for order in itertools.permutations(env.todo):
        stops = [env.depot, *order, env.depot]
        legs = [_path(env.roads, x, y) for x, y in itertools.pairwise(stops)]
        tours.append((sum(length(leg) for leg in legs), legs))
    for leg in min(tours)[1]:
        for town in leg[1:]:
            yield f"drive {town}"
        if leg[-1] != env.depot:
            yield "deliver"


def solve_escape(env, obs):
    rooms = {"hall": {"north": "library", "east": "study"}, "library": {"south": "hall", "east": "dome"},
             "study": {"west": "hall", "north": "dome"}, "dome": {"west": "library", "south": "study"}}

    def walk(a, b):
        q, prev = deque([a]), {a: None}
        while q:
            u = q.popleft()
            for d, v in sorted(rooms[u].items()):
                if v not in prev:
                    prev[v] = (u, d)
                    q.append(v)
        steps = []
        while prev[b] is not None:
            b, d = prev[b]
            steps.append(f"go {d}")
        return steps[::-1]

    for a in walk("hall", env.clue_room):
        yield a
    obs = yield f"examine {env.clue_thing}"
    code = re.search(r"digits (\d{4})", obs).group(1)[::-1]
    for a in walk(env.clue_room, env.safe_room):
        yield a
    yield f"open safe {code}"
    yield "take key"
    for a in walk(env.safe_room, "hall"):
        yield a
    yield "unlock door"


def _balance(left, right, atoms):
    species = [(f, 1) for f in left] + [(f, -1) for f in right]
    elements = sorted({e for f, _ in species for e in atoms(f)})
    rows = [[Fraction(atoms(f).get(e, 0) * s) for f, s in species] for e in elements]
    n = len(species)
    # fix the last coefficient to 1 and solve the rest by Gaussian elimination over fractions
    a = [r[:-1] + [-r[-1]] for r in rows]
    piv, r = [], 0
    for c in range(n - 1):
        p = next((i for i in range(r, len(a)) if a[i][c] != 0), None)
        if p is None:
            continue
        a[r], a[p] = a[p], a[r]
        a[r] = [x / a[r][c] for x in a[r]]
        for i in range(len(a)):
            if i != r and a[i][c] != 0:
                a[i] = [x - a[i][c] * y for x, y in zip(a[i], a[r], strict=True)]
        piv.append(c)
        r += 1
    sol = [Fraction(0)] * (n - 1)
    for i, c in enumerate(piv):
        sol[c] = a[i][-1]
    sol.append(Fraction(1))
    mult = lcm(*(x.denominator for x in sol))
    return [int(x * mult) for x in sol]


def solve_equations(env, obs):
    atoms = type(env).__init__.__globals__["atoms"]
    while True:
        left, right = env.queue[env.index]
        yield " ".join(map(str, _balance(left, right, atoms)))


def solve_caesar(env, obs):
    while True:
        yield "ANSWER " + env.plain[env.index]


def solve_swap(env, obs):
    while True:
        shelf = env.shelf
        target = sorted(shelf)
        i = next(k for k in range(len(shelf)) if shelf[k] != target[k])
        j = shelf.index(target[i])
        yield f"SWAP {i + 1} {j + 1}"


def solve_flights(env, obs):
    price, ids = min(env._valid_itineraries())
    yield call(tool="search", **{"from": env.origin, "to": env.dest})
    yield call(tool="book", flights=ids)


def solve_maze(env, obs):
    moves = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}

    def route(a, b):
        q, prev = deque([a]), {a: None}
        while q:
            u = q.popleft()
            for d, (dr, dc) in moves.items():
                v = (u[0] + dr, u[1] + dc)
                if v in env.open and v not in prev:
                    prev[v] = (u, d)
                    q.append(v)
        out = []
        while prev[b] is not None:
            b, d = prev[b]
            out.append(d)
        return out[::-1]

    # a plain loop, not `yield from`: the driver sends observations, which a list iterator refuses
    for d in route(env.pos, env.key) + route(env.key, env.door):  # noqa: UP028
        yield d


SOLVERS = {
    "caesar_relay": solve_caesar, "calendar_scheduler": solve_calendar, "courier_map": solve_courier,
    "equation_balancer": solve_equations, "escape_room": solve_escape, "flight_booking": solve_flights,
    "inventory_restock": solve_inventory, "key_maze": solve_maze, "ledger_reconcile": solve_ledger,
    "mastermind": solve_mastermind, "swap_sort": solve_swap, "water_jugs": solve_jugs,
}


def play(env, seed: int, policy) -> tuple[float, list[str]]:
    obs, _ = env.reset(seed=seed)
    observations, total = [obs], 0.0
    for _ in range(100):
        action = policy(obs)
        if action is None:
            break
        obs, r, term, trunc, info = env.step(action)
        json.dumps(info)
        assert isinstance(obs, str) and type(term) is bool and type(trunc) is bool
        observations.append(obs)
        total += r
        if term or trunc:
            break
    return total, observations


def solver_policy(env, name):
    gen = None

    def policy(obs):
        nonlocal gen
        try:
            if gen is None:
                gen = SOLVERS[name](env, obs)
                return next(gen)
            return gen.send(obs)
        except StopIteration:
            return None

    return policy


@pytest.mark.unit
def test_the_pool_is_large_diverse_and_complete():
    assert len(NAMES) >= 12
    assert set(SOLVERS) == set(NAMES)
    envs = pool.load_folder(pool.BUNDLED_POOL)
    assert all(e["hint"] and e["title"] and e["title"] != e["name"] for e in envs)


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_solver_reaches_return_one_and_hint_never_shows(name):
    env = load_env(name)
    hint = " ".join((pool.BUNDLED_POOL / f"{name}.hint").read_text().split())
    for seed in SEEDS:
        total, observations = play(env, seed, solver_policy(env, name))
        assert total == pytest.approx(1.0), f"{name} seed {seed}: solver got {total}"
        assert all(hint not in " ".join(o.split()) for o in observations)


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_degenerate_policies_stay_low(name):
    env = load_env(name)
    rng = random.Random(0)
    policies = {"empty": lambda o: "", "fixed": lambda o: "1", "echo": lambda o: o[:200],
                "random": lambda o: "".join(rng.choice(string.printable) for _ in range(40))}
    for label, policy in policies.items():
        for seed in SEEDS:
            total, _ = play(env, seed, policy)
            assert 0.0 <= total < 0.5, f"{name}: the {label} policy reached {total}"


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_episode(name):
    a, b = load_env(name), load_env(name)
    script = ["", "look", '{"tool": "ledger"}', "north", "GUESS ABCD", "fill a", "SWAP 1 2", "1 2 3"]

    def scripted():
        actions = iter(script * 3)
        return lambda obs: next(actions, None)

    for seed in SEEDS:
        assert play(a, seed, scripted()) == play(b, seed, scripted())


@pytest.mark.integration
@pytest.mark.parametrize("pool, count", [("bundled", len(NAMES)), ("starter", 4), ("family", 52)])
def test_every_bundled_env_passes_spade_validate(tmp_path, pool, count):
    designs, validated = tmp_path / "pool.jsonl", tmp_path / "validated.jsonl"
    res = run_spade("design", "--pool", pool, "--n", str(count), "--out", designs)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["rows"] == count
    res = run_spade("validate", "--designs", designs, "--out", validated, "--workers", "2")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in validated.read_text().splitlines()]
    bad = {r["title"]: (r["reason"], [c for c in r["checks"] if not c["ok"]]) for r in rows if not r["valid"]}
    assert not bad
    assert len(rows) == count


@pytest.mark.unit
def test_a_pool_smaller_than_n_is_dealt_in_passes_to_exactly_n_distinct_environments():
    from collections import Counter

    from spade_cli.core.records import env_id_for

    envs = pool.load_folder(pool.BUNDLED_POOL)
    n_pool = len(envs)
    n = 2 * n_pool + 5
    picked = pool.pick(envs, n, seed=3, iteration=7)
    assert len(picked) == n  # the budget rule: as many environments as the Designer's arms play
    ids = [env_id_for(e["code"], e["hint"]) for e in picked]
    assert len(set(ids)) == n  # a repeat is its own environment: validate, rollout, regret key by env_id
    assert len({env_id_for(e["code"], "") for e in picked}) == n  # and validate's code-only duplicate key
    # cycling: the first pass is the whole pool without replacement, then every env 2 or 3 times
    assert {e["name"] for e in picked[:n_pool]} == set(NAMES) and all("copy" not in e for e in picked[:n_pool])
    assert sorted(Counter(e["name"] for e in picked).values()) == [2] * (n_pool - 5) + [3] * 5
    assert [e["copy"] for e in picked[n_pool:]] == [1] * n_pool + [2] * 5
    # reproducible, independent of file order, different per iteration and per pass
    assert [e["code"] for e in pool.pick(envs[::-1], n, seed=3, iteration=7)] == [e["code"] for e in picked]
    assert [e["name"] for e in pool.pick(envs, n, seed=3, iteration=8)] != [e["name"] for e in picked]
    assert [e["name"] for e in picked[:n_pool]] != [e["name"] for e in picked[n_pool:2 * n_pool]]
    # n <= pool: the rows of old (no copies, the same first n of the ranking)
    assert [e["name"] for e in pool.pick(envs, 5, 3, 7)] == [e["name"] for e in picked[:5]]


@pytest.mark.unit
def test_a_copy_plays_exactly_as_its_original():
    original = next(e for e in pool.load_folder(pool.BUNDLED_POOL) if e["name"] == NAMES[0])
    copy = pool.as_copy(original, 2)
    assert copy["hint"] == original["hint"] and "(copy 2)" in copy["title"]

    def env_of(code: str) -> gym.Env:
        ns: dict = {}
        exec(compile(code, "env.py", "exec"), ns)
        assert ns.get("SPADE_POOL_COPY", 0) == (2 if code is copy["code"] else 0)
        return next(v for v in ns.values() if isinstance(v, type) and issubclass(v, gym.Env) and v is not gym.Env)()

    for seed in SEEDS:
        a, b = env_of(original["code"]), env_of(copy["code"])
        assert play(a, seed, solver_policy(a, NAMES[0])) == play(b, seed, solver_policy(b, NAMES[0]))


@pytest.mark.integration
def test_spade_design_fills_n_from_a_smaller_pool_and_every_copy_validates(tmp_path):
    designs, validated = tmp_path / "designs.jsonl", tmp_path / "validated.jsonl"
    res = run_spade("design", "--pool", "starter", "--n", "6", "--seed", "1", "--out", designs)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["envs"], summary["requested"]) == (6, 6, 6)
    rows = [json.loads(line) for line in designs.read_text().splitlines()]
    assert sorted(r["pool_copy"] for r in rows) == [0, 0, 0, 0, 1, 1]
    res = run_spade("validate", "--designs", designs, "--out", validated, "--workers", "2")
    assert res.returncode == 0, res.stderr
    checked = [json.loads(line) for line in validated.read_text().splitlines()]
    assert [(r["valid"], r["reason"]) for r in checked] == [(True, None)] * 6  # no copy is a `duplicate`


@pytest.mark.integration
def test_reasoning_gym_pool_is_scored_by_reasoning_gym(tmp_path):
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "rg.jsonl"
    res = run_spade("design", "--pool", "rg:leg_counting,word_sorting", "--n", "4", "--seed", "3", "--out", out)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["title"] for r in rows] == ["reasoning-gym leg_counting #0", "reasoning-gym word_sorting #0",
                                          "reasoning-gym leg_counting #1", "reasoning-gym word_sorting #1"]
    assert len({r["env_id"] for r in rows}) == 4
    for r in rows[:2]:
        ns: dict = {}
        exec(compile(r["code"], "rg.py", "exec"), ns)
        env = ns["ReasoningGymTask"]()
        for seed in range(3):
            obs, _ = env.reset(seed=seed)
            entry = next(e for e in ns["ITEMS"] if obs.startswith(e["question"]))
            _, reward, term, _, info = env.step(str(entry["answer"]))
            assert (reward, term) == (1.0, True)
            assert info["scorer"] in ("reasoning_gym", "reasoning_gym_default_rule")
            env.reset(seed=seed)
            assert env.step("")[1] == 0.0
    # word_sorting has its own scorer: the module imports reasoning-gym for it
    assert "get_score_answer_fn('word_sorting')" in rows[1]["code"]
    assert "import reasoning_gym" not in rows[0]["code"] and "from reasoning_gym" not in rows[0]["code"]
    res = run_spade("validate", "--designs", out, "--out", tmp_path / "v.jsonl")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["valid"] == 4
