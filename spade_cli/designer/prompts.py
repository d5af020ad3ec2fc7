"""The Designer's prompt, the memory summary in it, and the parser for what comes back.

The prompt is two chat messages. The system message states the environment contract (docs/architecture.md, 'The environment contract')
and the output format. The user message carries one worked example (an environment from the
bundled pool with its hint), the grounding document (or, for the ``--no-grounding`` ablation, an
invitation to pick any domain), the memory summary (or nothing, without ``--memory``), and the
request. Everything is plain text, so any chat model can be the Designer.

The memory summary tells the Designer how the learner did on past environments, labelled with
the same thresholds for every run:

- ``too easy``: the unhinted agent already solves it (unhinted mean >= 0.8);
- ``too hard``: even the hinted agent fails (hinted mean <= 0.2);
- ``learnable``: the hint helps a lot (regret >= 0.2) — the band SPADE wants more of;
- ``no signal``: none of the above (the hint does not help, or the scores are middling);
- ``untested``: admitted but never scored.

Parsing is forgiving in form and strict in substance: a ``<think>`` block is dropped, ```python,
``` and unterminated fences are accepted, the title may be ``Title: ...`` or a ``# ...`` heading,
the hint may be a ``Hint: ...`` section or a fenced ```hint block. A completion that yields no
code or no hint is kept with ``parse_error`` set; it is never dropped, because an unparseable
design must still cost the Designer its reward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EASY, HARD, LEARNABLE = 0.8, 0.2, 0.2

SYSTEM = """\
You are the Designer. You write training environments for a text agent, each a complete Python \
module, together with a privileged hint that makes the task easier for an agent that reads it.

The environment contract:
- The module defines exactly one subclass of gymnasium.Env.
- reset(self, *, seed=None, options=None) returns (observation: str, info: dict). It calls \
super().reset(seed=seed) first and draws all randomness from self.np_random.
- step(self, action: str) returns (observation: str, reward: float, terminated: bool, \
truncated: bool, info: dict). The action is the agent's raw reply: step must accept ANY text \
without raising (parse JSON or commands defensively and answer malformed input with an error \
observation).
- The episode return (sum of rewards) lies in [0, 1]; 1 means the task is solved. Give partial \
credit only if it stays within that range.
- The episode is long-horizon: solving it takes several well-chosen steps, and an empty reply, a \
fixed reply or random text must not reach a high return. End the episode (truncated=True) after a \
step budget.
- Deterministic given the seed and the action sequence. No network, no files, no subprocesses, no \
environment variables. Use only the Python standard library, gymnasium and numpy.
- Return plain Python types (str, float, bool, dict); the info dicts must be JSON-serialisable.
- The hint is never shown by the environment: it is given to some agents separately. It should \
state a strategy or a fact that makes the task clearly easier, without simply being the answer \
to one seed.

Answer in exactly this format:
Title: <a short title>
```python
<the complete module>
```
Hint: <the privileged hint, a few sentences>
"""

# The same request in a few lines, for a small model that cannot use the full contract and pays
# for every prompt token in its warm start and its updates (`--contract short`).
SHORT_SYSTEM = """\
You are the Designer. Write a training environment for a text agent: a Python module with one \
gymnasium.Env subclass whose step(action: str) returns (observation, reward, terminated, \
truncated, info) and whose return lies in [0, 1], and a privileged hint that makes it easier.
Answer as:
Title: <a short title>
```python
<the complete module>
```
Hint: <the hint>
"""
# The design space (`--contract spec`, spade_cli/designer/space.py): the Designer picks a cell and
# two knobs in one line; spade writes the code and the hint.
SPEC_SYSTEM = """\
You are the Designer. Choose a training environment for a text agent from a family of short \
round-based tasks: each round shows a cue word and a list of words or a number, and the agent \
must apply the cue's rule to it. The agent gets the rule as a hint only in some episodes.
Rules: first, last, second (a word of the list by its place), twice (the word shown twice), \
double, plus_one.
level 1-5: the list's length (2 to 6 words) or the number's digits (1 to 5). rounds 1-5. \
feedback: corrected (a wrong answer is shown the right one) or marked.
Answer as:
Spec: rule=<rule> level=<1-5> rounds=<1-5> feedback=<corrected|marked>
"""
CONTRACTS = {"full": SYSTEM, "short": SHORT_SYSTEM, "spec": SPEC_SYSTEM}

INTRO_EXAMPLE = "Here is an example of a complete answer in the required format."
NO_DOC = ("Choose any domain you like for the new environment.")
REQUEST = ("Now design a NEW environment{grounded}. Make it different from the example and from "
           "the environments in memory, and aim for {aim}.")
# What each Designer signal rewards, said neutrally: the prompt must not describe one signal while
# `spade regret` scores another (the ablation would then compare prompts, not signals).
AIMS = {
    "regret": "a task the agent can learn: solvable with the hint, not yet solved without it",
    "ema_lp": ("a task on which the agent's success without the hint changes from one iteration to "
               "the next as it trains"),
    "learnability": ("a task the agent solves without the hint only some of the time (the reward is "
                     "p(1-p), p its success rate)"),
}


def label(unhinted: float | None, hinted: float | None, regret: float | None) -> str:
    if unhinted is None and hinted is None:
        return "untested"
    if unhinted is not None and unhinted >= EASY:
        return "too easy"
    if hinted is not None and hinted <= HARD:
        return "too hard"
    if regret is not None and regret >= LEARNABLE:
        return "learnable"
    return "no signal"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _trend(history: list, last: dict) -> str:
    """How an env measured more than once (a replay) moved: its first unhinted mean, so the Designer
    sees whether the learner got better at it; empty for an env measured once."""
    first = next((h for h in history if h.get("unhinted_mean") is not None), None)
    if first is None or first is last or last.get("unhinted_mean") is None:
        return ""
    return f" (from {_fmt(first['unhinted_mean'])} at iteration {first.get('iteration')})"


def memory_summary(memory: list, k: int = 12, hint_chars: int = 120) -> str | None:
    """A compact text block about the most recent ``k`` environments in memory (Memory records),
    with label counts over the whole memory; None when the memory is empty. An env measured in
    several iterations shows its first unhinted mean beside the latest (the learner's progress)."""
    if not memory:
        return None
    entries = []
    for m in memory:
        last = m.history[-1] if m.history else {}
        it = last.get("iteration", m.first_iteration)
        flags = (m.extra or {}).get("flags") or []
        lab = ("flagged: " + ", ".join(flags) if flags  # its regret was bought, not earned
               else label(last.get("unhinted_mean"), last.get("hinted_mean"), last.get("regret")))
        entries.append((it, abs(last.get("regret") or 0.0), m.env_id, m, last, lab))
    counts: dict[str, int] = {}
    for e in entries:
        counts[e[5]] = counts.get(e[5], 0) + 1
    entries.sort(key=lambda e: (-e[0], -e[1], e[2]))  # newest first, then the most informative
    head = ", ".join(f"{n} {lab}" for lab, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    lines = [f"Environment memory: {len(memory)} environments so far ({head}). "
             f"The {min(k, len(entries))} most recent, with the learner's mean return without and "
             "with the hint:"]
    for it, _, _, m, last, lab in entries[:k]:
        hint = " ".join((m.hint or "").split())
        hint = hint if len(hint) <= hint_chars else hint[:hint_chars].rstrip() + "…"
        lines.append(f"- [{lab}] {m.title or m.env_id} (iteration {it}): unhinted "
                     f"{_fmt(last.get('unhinted_mean'))}{_trend(m.history, last)}, hinted {_fmt(last.get('hinted_mean'))}, "
                     f"regret {_fmt(last.get('regret'))}. Hint was: {hint or 'none'}")
    lines.append("Move the frontier: avoid repeating these, make too-easy ideas harder and too-hard "
                 "ideas more approachable.")
    return "\n".join(lines)


def format_answer(title: str, code: str, hint: str) -> str:
    """A design in the output format the prompt asks for (used for the worked example)."""
    return f"Title: {title}\n```python\n{code.rstrip()}\n```\nHint: {hint.strip()}\n"


def build_messages(example: dict | None, doc_text: str | None, memory_text: str | None,
                   signal: str = "regret", contract: str = "full") -> list[dict]:
    """The Designer prompt as chat messages. ``example`` is ``{title, code, hint}``, or None for a
    compact prompt without a worked example (the system message still states the format);
    ``signal`` (a key of ``AIMS``) is the Designer reward `spade regret` will use; ``contract``
    (a key of ``CONTRACTS``) is the system message: the environment contract in full, or short."""
    if signal not in AIMS:
        raise ValueError(f"unknown signal {signal!r}; choose {', '.join(AIMS)}")
    if contract not in CONTRACTS:
        raise ValueError(f"unknown contract {contract!r}; choose {', '.join(CONTRACTS)}")
    parts = []
    if example:
        parts += [INTRO_EXAMPLE, format_answer(example["title"], example["code"], example["hint"]).rstrip()]
    if doc_text is not None:
        parts.append("Ground the new environment in this document: take its domain, entities, rules "
                      "or procedures as the material of the task.\n<document>\n" + doc_text.strip()
                      + "\n</document>")
    else:
        parts.append(NO_DOC)
    if memory_text:
        parts.append(memory_text)
    parts.append(REQUEST.format(grounded=" grounded in the document" if doc_text is not None else "",
                                aim=AIMS[signal]))
    return [{"role": "system", "content": CONTRACTS[contract]}, {"role": "user", "content": "\n\n".join(parts)}]


# -- parsing ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parsed:
    title: str | None
    code: str | None
    hint: str | None
    error: str | None
    spec: dict | None = None  # the design space's spec (``--contract spec``), as compiled


_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.S)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[ \t]*$", re.M)
_TITLE = re.compile(r"^[ \t]*(?:\*\*)?(?:title|name)(?:\*\*)?\s*[:：]\s*(.+?)\s*$|^[ \t]*#{1,3}[ \t]+(.+?)\s*$",
                    re.I | re.M)
_HINT = re.compile(r"^[ \t]*(?:\*\*)?(?:privileged[ \t]+)?hint(?:\*\*)?\s*[:：](?:\*\*)?[ \t]*", re.I | re.M)


def _blocks(text: str) -> list[tuple[str, str, int, int]]:
    """Fenced blocks as (language, body, start, end); an unterminated last fence runs to the end."""
    out = []
    fences = list(_FENCE.finditer(text))
    i = 0
    while i < len(fences):
        lang = fences[i].group(1).lower()
        start = fences[i].end()
        if i + 1 < len(fences):
            close = fences[i + 1]
            # a closing fence may not carry a language; "```python" right after another block opens one
            out.append((lang, text[start:close.start()].strip("\n"), fences[i].start(), close.end()))
            i += 2
        else:
            out.append((lang, text[start:].strip("\n"), fences[i].start(), len(text)))
            i += 1
    return out


def _answer_body(text: str) -> str:
    body = _THINK.sub("", text)
    if "</think>" in body:  # a template that opens the think block in the prompt
        body = body.split("</think>", 1)[1]
    return body


def parse_spec_completion(text: str | None) -> Parsed:
    """A ``--contract spec`` completion: its first ``Spec:`` line (or, without one, its first line
    with a ``rule=``), compiled by the design space into title, code and hint."""
    from spade_cli.designer import space

    if not text or not text.strip():
        return Parsed(None, None, None, "empty completion")
    lines = _answer_body(text).splitlines()
    line = next((ln for ln in lines if ln.strip().lower().startswith("spec")), None)
    line = line or next((ln for ln in lines if "rule" in ln.lower()), None)
    if line is None:
        return Parsed(None, None, None, "no spec line")
    # "Spec: rule=..." drops its label; a "spec rule=..." without the colon is parsed whole
    head, colon, rest = line.partition(":")
    text = rest if colon and head.strip().lower().startswith("spec") else line
    try:
        env = space.compile_spec(space.parse_spec(text))
    except space.SpecError as exc:
        return Parsed(None, None, None, f"bad spec: {exc}")
    return Parsed(env["title"], env["code"], env["hint"], None, env["spec"])


def parse_completion(text: str | None, contract: str = "full") -> Parsed:
    """Title, code and hint from a Designer completion (see the module docstring)."""
    if contract == "spec":
        return parse_spec_completion(text)
    if not text or not text.strip():
        return Parsed(None, None, None, "empty completion")
    body = _answer_body(text)
    blocks = _blocks(body)
    code_block = next((b for b in blocks if b[0] in ("python", "py", "python3")), None)
    if code_block is None:
        code_block = next((b for b in blocks if b[0] == "" and "class " in b[1] and "def step" in b[1]),
                          None)
    hint_block = next((b for b in blocks if b[0] == "hint"), None)
    outside = body
    for b in sorted(blocks, key=lambda b: -b[2]):
        outside = outside[:b[2]] + "\n" + outside[b[3]:]

    title = None
    m = _TITLE.search(outside)
    if m:
        title = (m.group(1) or m.group(2)).strip().strip("*").strip() or None

    hint = hint_block[1].strip() if hint_block else None
    if not hint:
        hm = _HINT.search(outside)
        if hm:
            rest = outside[hm.end():]
            # the hint runs until a blank line followed by another labelled section, or the end
            stop = re.search(r"\n\s*\n(?=[ \t]*(?:\*\*)?[A-Z][A-Za-z ]{0,30}:)", rest)
            hint = (rest[:stop.start()] if stop else rest).strip() or None

    code = code_block[1].strip("\n") if code_block else None
    if code is not None and not code.strip():
        code = None
    if code is None and hint is None:
        return Parsed(title, None, None, "no fenced python block and no hint section")
    if code is None:
        return Parsed(title, None, None, "no fenced python block")
    if hint is None:
        return Parsed(title, None, None, "no hint section")
    return Parsed(title, code + "\n", hint, None)
