"""Probe policies for the Designer's reward hacks: replies made from the hint alone, and replies
with no task content at all.

Hint-regret pays a Designer for a gap between hinted and unhinted play. The cheapest way to buy
that gap is not a learnable task but a hint that *is* the answer (a password the reward checks
for, a fixed answer sequence) or a reward that only looks at the reply's form (its length, its
line count, a JSON shape) with the hint saying which form. An agent that copies its context gets
the maximum regret on such envs, and the Designer learns to write more of them.

`spade validate` plays these probes after the contract and `trivial` checks:

* ``hint_replies``: the whole hint; each line, sentence and code block; each quoted, numeric or
  code-like token (``quokka-saffron-17``); the numbers all at once; the code-like tokens joined.
* ``hint_sequences``: the hint's numbers one per turn; the words after its last colon one per turn.
* ``format_replies``: filler ("a") at every length, line count and word count the hint mentions,
  plus common shapes (a JSON object, a code block, a numbered list, fixed lengths).

A multi-turn env gets each family as one episode that cycles through the replies (any turn may
score); an env that ends after one step gets each reply as an episode of its own, up to a cap.
A probe that reaches the ``trivial`` threshold is confirmed on a second seed before it counts:
a seed whose answer happens to be one of the hint's numbers is not a hack, an answer that is the
same for every seed is. Reasons: ``hint_is_answer`` and ``format_only`` (docs/architecture.md, 'Reason codes').

What this does not catch: a hint that encodes the answer in a way no probe reproduces (a cipher,
an instruction the agent must follow), a reward keyed to a form the hint does not name, or an
answer that changes with the seed. Hints that are answer tables keyed by what the observation
shows are ``answer_table``'s (``spade_cli/checks/keyed.py``); the regret audits (replaying hinted
solutions on other seeds, and content-free on their own) are the second line (docs/regret.md).

    replies = hint_replies("Say the passphrase: quokka-saffron-17")
    # ['Say the passphrase: quokka-saffron-17', 'quokka-saffron-17', ...]
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")  # "15." at a sentence end is 15
QUOTED = re.compile(r"'([^'\n]{2,120})'|\"([^\"\n]{2,120})\"|`([^`\n]{2,120})`")
CODE_BLOCK = re.compile(r"```[\w-]*\n?(.*?)```", re.S)
# a word with a digit, hyphen or underscore inside: passwords, codes, identifiers
CODE_LIKE = re.compile(r"\b[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)+\b|\b(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z0-9]{3,}\b")
SENTENCE = re.compile(r"(?<=[.!?;])\s+")
MAX_REPLIES = 32          # per family, after de-duplication
MAX_SINGLE_SHOT = 10      # episodes per family for an env that ends after one step
MAX_FILLER = 4096         # longest filler reply


def _unique(items: list[str], cap: int = MAX_REPLIES) -> list[str]:
    out: list[str] = []
    for x in items:
        x = x.strip()
        if x and x not in out:
            out.append(x)
    return out[:cap]


def numbers(hint: str) -> list[str]:
    return NUMBER.findall(hint)


def hint_replies(hint: str) -> list[str]:
    """Replies an agent could make by copying parts of the hint, most specific first."""
    quoted = [next(g for g in m.groups() if g) for m in QUOTED.finditer(hint)]
    blocks = [b.strip() for b in CODE_BLOCK.findall(hint)]
    code = CODE_LIKE.findall(hint)
    lines = [ln for ln in hint.splitlines()]
    sentences = [s for ln in lines for s in SENTENCE.split(ln)]
    after_colon = [hint.rsplit(":", 1)[1]] if ":" in hint else []
    nums = numbers(hint)
    joined = [" ".join(nums), ", ".join(nums)] if len(nums) > 1 else []
    if len(code) > 1:
        joined += ["".join(code), " ".join(code), "-".join(code)]
    return _unique([*quoted, *code, *blocks, *after_colon, *joined, *nums, hint, *lines, *sentences])


def hint_sequences(hint: str) -> list[list[str]]:
    """Multi-turn replies: the hint's numbers, or the words after its last colon, one per turn."""
    seqs = []
    nums = numbers(hint)
    if len(nums) > 1:
        seqs.append(nums)
    if ":" in hint:
        words = re.findall(r"[\w'-]+", hint.rsplit(":", 1)[1])
        if 1 < len(words) <= 32 and words != nums:
            seqs.append(words)
    return seqs


def format_replies(hint: str) -> list[str]:
    """Content-free replies at the lengths and shapes the hint mentions, and common shapes."""
    sized = []
    for x in numbers(hint):
        try:
            n = int(float(x))
        except ValueError:
            continue
        if 0 < n <= MAX_FILLER:
            sized.append("a" * n)
        if 0 < n <= 200:
            sized += ["\n".join(["a"] * n), " ".join(["a"] * n)]
    shapes = ['{"answer": "a"}', "```\na\n```", "1. a\n2. a\n3. a", "a" * 8, "a" * 40, "a" * 200, "A", "a a a"]
    return _unique(sized + shapes)


def policies(hint: str, single_shot: bool) -> dict[str, list[tuple[str, list[str]]]]:
    """Per family, the probe episodes to play: (name, the reply of each turn, cycled)."""
    fams: dict[str, list[tuple[str, list[str]]]] = {"hint_is_answer": [], "format_only": []}
    for reason, replies in (("hint_is_answer", hint_replies(hint)), ("format_only", format_replies(hint))):
        if single_shot:
            fams[reason] += [(f"{reason}:{r[:40]}", [r]) for r in replies[:MAX_SINGLE_SHOT]]
        elif replies:
            fams[reason].append((f"{reason}:cycle", replies))
    if not single_shot:
        fams["hint_is_answer"] += [(f"hint_is_answer:sequence:{' '.join(s)[:40]}", s) for s in hint_sequences(hint)]
    return fams
