"""Fixed environment pools: the paper's baselines that train the Agent without a Designer.

``spade design --pool SPEC`` writes design rows from a pool instead of a model. SPEC is one of:

- a folder of environments, each ``NAME.py`` with a ``NAME.hint`` sidecar; the title is the first
  line of the module docstring. The bundled pool (``spade_cli/data/pool/``, pass ``--pool bundled``)
  holds hand-written, long-horizon environments: JSON tool use against simulated backends,
  puzzles, planning and text games. It doubles as the worked example in the Designer's prompt.
  ``--pool starter`` names four short environments used to warm-start small models: rounds of
  copying, a rule, a successor and a lookup, each scored a quarter per round, so a small model
  wins part of an episode and GRPO groups have reward spread. ``--pool family`` generates 52
  envs of one skeleton (rule x feedback x scoring, ``spade_cli/envs/family.py``): Designer warm-start
  targets for a small model (docs/results.md: how the Designer came to train).
- a ``.jsonl`` file of design (or validation) records, e.g. the designs of a frozen Designer;
- ``rg:NAME,NAME,...``: reasoning-gym tasks wrapped as single-turn environments. Each environment
  embeds ``RG_ITEMS`` items generated at design time (seeded by the run seed, iteration and task),
  ``reset`` picks one with ``self.np_random`` and shows its question, and ``step`` scores the reply
  with reasoning-gym's own scoring for that task. A task that keeps reasoning-gym's default
  ``score_answer`` (1 for an exact match, len(answer)/len(reply) when the reply contains the
  answer; 33 of its 106 tasks) gets that rule embedded, so the module stays standard-library
  only. A task with its own scorer makes the module import reasoning_gym inside the sandbox (it
  lives in spade's environment: it is how the task is scored, not something a Designer writes)
  and call ``get_score_answer_fn(task)``; where it cannot be imported the default rule is used.
  ``info["scorer"]`` says which. Items whose gold answer does not score 1 after the JSON round
  trip are left out at design time, so every embedded item is solvable.

Selection is reproducible and order-independent, and always yields ``n`` environments, so that a
fixed-pool baseline plays as many Agent episodes per iteration as the Designer's arms (the budget
rule of the comparison). A folder or JSONL pool of P distinct environments is dealt in passes: each
pass is a fresh ranking of the whole pool by ``sha256(env_id | seed | iteration | pass)`` (pass 0
is ``env_id | seed | iteration``), and passes are taken in order until ``n`` are dealt. So the
first P are drawn without replacement, and with ``n = q*P + r`` every environment appears q or
q+1 times: cycling, not sampling with replacement, which could leave an environment out while
playing another three times.

An environment dealt a second time cannot enter an iteration under the same ``env_id``: validate
would reject it as a ``duplicate``, rollout would play it once, and regret and the memory key by
``env_id``. Its copy ``c`` (the pass number) therefore gets one line appended to its code,
``SPADE_POOL_COPY = c``: the environment behaves exactly as the original, but its content id
differs, so its episodes get other env seeds (an episode's seed derives from the ``env_id``) and
it is scored and remembered as an environment of its own. Pass 0 leaves the code untouched, so a
pool at least as large as ``n`` gives the same rows as it always did.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

from spade_cli.core.artifacts import InputError, SpadeError, read_rows
from spade_cli.core.records import Design, env_id_for

BUNDLED_POOL = Path(__file__).resolve().parents[1] / "data" / "pool"
# Four short environments (~800 bytes each) that a 13M-parameter model learns in minutes on a CPU:
# the quickstart warm-starts its Agent on their solvers' episodes (`spade warmstart --agent-pool starter`).
STARTER_POOL = Path(__file__).resolve().parents[1] / "data" / "starter"
# ``family``: the generated skeleton x rule x feedback x scoring envs (spade_cli/envs/family.py), Designer
# warm-start targets for a small model. Its "path" is the generator, so a stage that reads it
# is out of date when the generator changes.
FAMILY_POOL = Path(__file__).resolve().parent / "family.py"
# The design space's cells (spade_cli/designer/space.py): ``space`` every trainable cell (the uniform
# static pool of the curriculum experiments), ``space-heldout`` the held-out cells, ``space-grid``
# all of them (the probe grid), ``space-practice`` the Agent's warm-start envs.
SPACE_POOL = Path(__file__).resolve().parents[1] / "designer" / "space.py"
SPACE_POOLS = {"space": False, "space-heldout": True, "space-grid": None}
NAMED_POOLS = {"bundled": BUNDLED_POOL, "starter": STARTER_POOL, "family": FAMILY_POOL,
               **{name: SPACE_POOL for name in (*SPACE_POOLS, "space-practice")}}


def pool_path(spec: str) -> Path:
    """A pool folder or file from a spec: ``bundled``, ``starter``, ``family`` or a path."""
    return NAMED_POOLS.get(spec, Path(spec))


def load_envs(spec: str) -> list[dict]:
    """``{name, title, code, hint, source}`` of every environment of a named pool, folder or file."""
    if spec == "family":
        from spade_cli.envs import family

        return [{**e, "source": f"family:{e['name']}"} for e in family.members(0)]
    if spec in SPACE_POOLS or spec == "space-practice":
        from spade_cli.designer import space

        envs = space.practice_envs() if spec == "space-practice" else space.grid_envs(SPACE_POOLS[spec])
        return [{**e, "source": f"{spec}:{e['name']}"} for e in envs]
    path = pool_path(spec)
    if path.is_dir():
        return load_folder(path)
    if path.is_file():
        return load_jsonl(path)
    named = ", ".join(repr(n) for n in NAMED_POOLS)
    raise InputError(path, None, f"no such pool folder or file (or use rg:NAME,... or one of {named})")


RG_ITEMS = 8


def _title_of(code: str, fallback: str) -> str:
    try:
        doc = ast.get_docstring(ast.parse(code))
    except SyntaxError:
        doc = None
    first = (doc or "").strip().splitlines()
    return first[0].strip().rstrip(".") if first else fallback


def load_folder(folder: Path) -> list[dict]:
    """``{name, title, code, hint}`` for every ``NAME.py`` with a ``NAME.hint`` in ``folder``."""
    out = []
    for py in sorted(folder.glob("*.py")):
        if py.name.startswith("_"):
            continue
        hint_path = py.with_suffix(".hint")
        if not hint_path.exists():
            raise InputError(py, None, f"pool environment has no hint sidecar {hint_path.name}")
        code = py.read_text(encoding="utf-8")
        hint = hint_path.read_text(encoding="utf-8").strip()
        if not hint:
            raise InputError(hint_path, None, "empty hint")
        out.append({"name": py.stem, "title": _title_of(code, py.stem), "code": code, "hint": hint,
                    "source": f"pool:{py.name}"})
    if not out:
        raise SpadeError(f"{folder} holds no NAME.py + NAME.hint environments")
    return out


# The bundled environment shown to the Designer as its worked example: short, complete, multi-step.
EXAMPLE_ENV = "ledger_reconcile"


def worked_example() -> dict:
    envs = {e["name"]: e for e in load_folder(BUNDLED_POOL)}
    return envs[EXAMPLE_ENV]


def load_jsonl(path: Path) -> list[dict]:
    out = []
    for p, line, rec in read_rows(path, expect=("spade.design", "spade.validation")):
        if not rec.code or not rec.hint:
            raise InputError(p, line, "a pool design needs both code and hint")
        out.append({"name": rec.env_id, "title": rec.title, "code": rec.code, "hint": rec.hint,
                    "source": f"pool:{p.name}:{line}"})
    if not out:
        raise InputError(path, None, "the pool file holds no environment (no spade.design/1 row with code and hint)")
    return out


def _rank(env_id: str, seed: int, iteration: int, deal: int = 0) -> str:
    key = f"{env_id}|{seed}|{iteration}" + (f"|{deal}" if deal else "")
    return hashlib.sha256(key.encode()).hexdigest()


# Appended to the code of a repeated environment: a statement, not a comment, so that a duplicate
# check which normalises formatting and comments still tells the copy from the original.
COPY_LINE = "\n\nSPADE_POOL_COPY = {copy}  # the same environment dealt again: another env_id, other seeds\n"


def as_copy(env: dict, copy: int) -> dict:
    """Copy ``copy`` (>= 1) of a pool environment: same behaviour, its own env_id and seeds."""
    return {**env, "code": env["code"].rstrip() + COPY_LINE.format(copy=copy), "copy": copy,
            "title": f"{env['title']} (copy {copy})", "source": f"{env['source']}#copy{copy}"}


def pick(envs: list[dict], n: int, seed: int, iteration: int) -> list[dict]:
    """Exactly ``n`` environments, dealt in hash-ranked passes over the distinct ones (see the module
    docstring); independent of file order. Environments of pass c >= 1 are copies (``as_copy``)."""
    unique = {env_id_for(e["code"], e["hint"]): e for e in envs}
    if not unique:
        raise SpadeError("the pool holds no environment")
    out: list[dict] = []
    for deal in range(-(-n // len(unique))):
        ranked = sorted(unique.items(), key=lambda kv: _rank(kv[0], seed, iteration, deal))
        out += [e if deal == 0 else as_copy(e, deal) for _, e in ranked[:n - len(out)]]
    return out


# -- reasoning-gym ---------------------------------------------------------------------------------

RG_TEMPLATE = '''"""{title}

A single-turn reasoning-gym task ({task}) wrapped as a spade environment: reset shows one of the
embedded questions, step scores the reply with reasoning-gym's score_answer for this task.
"""

import json
import string

import gymnasium as gym
from gymnasium import spaces

{scorer_block}
ITEMS = json.loads({items!r})
SUFFIX = "\\n\\nReply with the final answer only."
# the questions may hold characters beyond ASCII; the spaces must admit every observation
CHARSET = string.printable + "".join(sorted(set("".join(e["question"] for e in ITEMS)) - set(string.printable)))


def _default_rule(answer, entry):
    gold = entry["answer"]
    if not answer:
        return 0.0
    if answer == gold:
        return 1.0
    return len(gold) / len(answer) if gold in answer else 0.0


class ReasoningGymTask(gym.Env):
    metadata = {{"render_modes": []}}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=100000, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=100000, min_length=0, charset=string.printable)
        self.entry = None
        self.done = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.entry = ITEMS[int(self.np_random.integers(len(ITEMS)))]
        self.done = False
        prompt = self.entry["question"] + SUFFIX
        return prompt, {{"task": {task!r}}}

    def step(self, action):
        if self.done or self.entry is None:
            return "The episode is over.", 0.0, True, False, {{"scorer": SCORER}}
        self.done = True
        answer = str(action).strip()
        try:
            score = float(_SCORE(answer, self.entry)) if _SCORE else _default_rule(answer, self.entry)
        except Exception:
            score = 0.0
        score = min(1.0, max(0.0, score)) if score == score else 0.0
        verdict = "Correct." if score >= 1.0 else "Not correct."
        return verdict, score, True, False, {{"scorer": SCORER, "score": score}}
'''

# A task that keeps reasoning-gym's default score_answer gets that rule embedded (no import: the
# env stays stdlib-only and loads in milliseconds); a task with its own scorer imports
# reasoning-gym inside the sandbox (about 2 s, within the 3 s import deadline on an idle machine).
RG_IMPORT = """try:
    from reasoning_gym import get_score_answer_fn

    _SCORE = get_score_answer_fn({task!r})
    SCORER = "reasoning_gym"
except Exception:  # reasoning-gym missing: its default exact/containment rule
    _SCORE = None
    SCORER = "fallback"
"""
RG_DEFAULT = """_SCORE = None
SCORER = "reasoning_gym_default_rule"  # this task uses reasoning-gym's default score_answer
"""

RG_HINT = ("This is the reasoning-gym task '{task}'. Work it out step by step before answering, check "
           "the result against every condition in the question, and reply with nothing but the final "
           "answer in exactly the format the question asks for.")


def rg_design(task: str, seed: int, iteration: int, index: int) -> dict:
    """One reasoning-gym environment: ``{name, title, code, hint}`` with embedded items."""
    try:
        import reasoning_gym
    except ImportError:
        raise SpadeError("--pool rg:... needs reasoning-gym (pip install 'spade[eval]')") from None
    digest = hashlib.sha256(f"rg|{task}|{seed}|{iteration}|{index}".encode()).hexdigest()
    try:
        ds = reasoning_gym.create_dataset(task, size=RG_ITEMS * 2, seed=int(digest[:8], 16))
    except Exception as exc:  # unknown name, bad config
        raise SpadeError(f"reasoning-gym cannot create the task {task!r}: {exc}") from None
    items = []
    for entry in ds:
        row = json.loads(json.dumps({"question": entry["question"], "answer": entry["answer"],
                                     "metadata": entry.get("metadata", {})}, default=str))
        try:
            ok = ds.score_answer(str(row["answer"]), row) >= 1.0
        except Exception:
            ok = False
        if ok:  # the gold answer must still score 1 after the JSON round trip
            items.append(row)
        if len(items) == RG_ITEMS:
            break
    if not items:
        raise SpadeError(f"reasoning-gym task {task!r}: no item survives the JSON round trip")
    title = f"reasoning-gym {task} #{index}"
    from reasoning_gym.dataset import ProceduralDataset

    own_scorer = type(ds).score_answer is not ProceduralDataset.score_answer
    block = RG_IMPORT.format(task=task) if own_scorer else RG_DEFAULT
    code = RG_TEMPLATE.format(title=title, task=task, items=json.dumps(items, ensure_ascii=False),
                              scorer_block=block)
    return {"name": f"rg-{task}-{index}", "title": title, "code": code, "hint": RG_HINT.format(task=task),
            "source": f"rg:{task}"}


def load_pool(spec: str, n: int, seed: int, iteration: int) -> list[dict]:
    """The ``n`` (or fewer) environments a pool spec yields for this seed and iteration."""
    if spec.startswith("rg:"):
        tasks = [t.strip() for t in spec[3:].split(",") if t.strip()]
        if not tasks:
            raise SpadeError("--pool rg: needs at least one reasoning-gym task name, e.g. rg:leg_counting")
        return [rg_design(tasks[i % len(tasks)], seed, iteration, i // len(tasks)) for i in range(n)]
    return pick(load_envs(spec), n, seed, iteration)


def pool_rows(envs: list[dict], iteration: int, seed: int) -> list[Design]:
    return [Design(iteration=iteration, group_id=None, sample=0, doc=None, messages=None, completion=None,
                   title=e["title"], code=e["code"], hint=e["hint"], parse_error=None, tokens=None,
                   gen={"model": None, "backend": "pool", "temperature": None, "seed": seed},
                   extra={"pool_source": e["source"], "pool_copy": e.get("copy", 0),
                          **({"spec": e["spec"]} if "spec" in e else {})}) for e in envs]
