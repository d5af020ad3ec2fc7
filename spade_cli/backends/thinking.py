"""Reasoning with its own budget: two-phase generation over any backend.

A thinking model writes ``<think>…</think>`` and then its answer. One ``max_tokens`` for both lets a
long reasoning block eat the answer: cut before ``</think>``, the reply has no answer at all. So a
reply is generated in two phases through the plain ``Backend.generate`` interface, the same way on
hf, vllm, openai and fake:

1. the reasoning: up to ``think_tokens``, stopping at the ``</think>`` token (``stop_token_ids``);
2. the answer: the same token ids continued (prompt + phase 1), up to ``answer_tokens``.

A reasoning block still open when its budget runs out follows ``overflow``:

* ``close`` (budget forcing): spade appends the tokens of ``close_text`` (``"\\n</think>\\n\\n"``,
  Qwen3's own separator) and the model answers within the answer budget. Those tokens were not
  sampled: their entry of ``extra["sampled_mask"]`` is 0 and their log-prob None, so training masks
  them out like environment tokens.
* ``end``: the reply ends there, ``extra["think_overflow"]`` says so and the caller decides (the
  rollout engine sends an empty action and records the overflow in the turn).

A reply that never opens a reasoning block (thinking off, or a model that answers at once) is an
answer from its first token: phase 1 tokens count as answer tokens and phase 2 gets what is left of
the answer budget. A reply that ends (EOS) inside an open block is not continued either; it is
reported as ``think_overflow`` too, since it has no answer.

Every returned sample carries ``extra``: ``sampled_mask`` (1 = sampled), ``think_tokens``,
``answer_tokens``, ``forced_tokens``, ``think_overflow``.

    think = Thinking(think_tokens=2048, answer_tokens=512, overflow="close").bind(backend.tokenizer)
    [[reply]] = generate_thinking(backend, [ids], 1, Sampling(temperature=0.6), think, seeds=[7])
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from spade_cli.backends import GenSample, Sampling, keyed, prompt_key, sample_seed

OVERFLOW = ("close", "end")


@dataclass(frozen=True)
class Thinking:
    think_tokens: int
    answer_tokens: int
    overflow: str = "close"
    close_text: str = "\n</think>\n\n"
    open_id: int = -1
    close_id: int = -1
    forced: tuple[int, ...] = field(default=())

    def bind(self, tokenizer: Any) -> Thinking:
        """These budgets with the tokenizer's ``<think>``/``</think>`` ids resolved."""
        from spade_cli.core.artifacts import SpadeError

        if self.overflow not in OVERFLOW:
            raise SpadeError(f"think overflow must be one of {', '.join(OVERFLOW)}, got {self.overflow!r}")
        if self.think_tokens < 1 or self.answer_tokens < 1:
            raise SpadeError("think and answer budgets must be at least 1 token")
        ids = {}
        for tag in ("<think>", "</think>"):
            got = tokenizer.encode(tag, add_special_tokens=False) if hasattr(tokenizer, "encode") else []
            if len(got) != 1:
                raise SpadeError(f"reasoning budgets need {tag} as one token; this tokenizer splits it into "
                                 f"{len(got)}: use --max-tokens alone (no --think-tokens) for this model")
            ids[tag] = got[0]
        forced = tuple(tokenizer.encode(self.close_text, add_special_tokens=False))
        return replace(self, open_id=ids["<think>"], close_id=ids["</think>"], forced=forced)


def _opened(prompt: list[int], t: Thinking) -> bool:
    """The generation prompt itself opens the block (templates that end with ``<think>\\n``)."""
    tail = prompt[-3:]
    return t.open_id in tail and t.close_id not in tail[tail.index(t.open_id):]


def _phase2_seed(seed: int, j: int) -> int:
    return sample_seed(sample_seed(seed, j), 1)


def generate_thinking(backend: Any, prompts: list[list[int]], n: int, sampling: Sampling, think: Thinking,
                      seeds: list[int] | None = None, keys: list[str] | None = None) -> list[list[GenSample]]:
    """For every prompt, ``n`` replies generated in two phases (see the module docstring); ``keys``
    route a prompt's requests of both phases alike (``spade_cli.backends.keyed``)."""
    if think.close_id < 0:
        raise ValueError("Thinking.bind(tokenizer) first")
    p1 = replace(sampling, max_tokens=think.think_tokens,
                 stop_token_ids=tuple(sampling.stop_token_ids) + (think.close_id,))
    if keys is None and getattr(backend, "routes_by_key", False):
        keys = [prompt_key(p) for p in prompts]  # the answer goes where its reasoning's prefix is cached
    first = backend.generate(prompts, n, p1, seeds=seeds, **keyed(backend, keys))
    plans: list[list[dict]] = []
    todo: dict[int, list[tuple[int, int, list[int], int | None]]] = {}  # budget -> (i, j, ids, seed)
    for i, (prompt, group) in enumerate(zip(prompts, first, strict=True)):
        row = []
        for j, s in enumerate(group):
            ids = list(s.token_ids)
            opened = _opened(prompt, think) or think.open_id in ids
            closed = think.close_id in ids
            plan = {"s1": s, "forced": [], "think": 0, "overflow": False, "budget": 0}
            if closed:
                plan["think"] = ids.index(think.close_id) + 1
                plan["budget"] = think.answer_tokens if ids[-1] == think.close_id else 0
            elif opened:
                plan["think"] = len(ids)
                if s.finish_reason == "length" and think.overflow == "close":
                    plan["forced"], plan["budget"] = list(think.forced), think.answer_tokens
                else:
                    plan["overflow"] = True
            elif s.finish_reason == "length":
                plan["budget"] = max(0, think.answer_tokens - len(ids))
            if plan["budget"]:
                seed = (_phase2_seed(seeds[i], j) if seeds is not None
                        else (sampling.seed + 1 if sampling.seed is not None else None))
                todo.setdefault(plan["budget"], []).append((i, j, list(prompt) + ids + plan["forced"], seed))
            row.append(plan)
        plans.append(row)
    for budget, jobs in todo.items():
        p2 = replace(sampling, max_tokens=budget)
        outs = backend.generate([ids for _, _, ids, _ in jobs], 1, p2,
                                seeds=[s for *_, s in jobs] if seeds is not None else None,
                                **keyed(backend, None if keys is None else [keys[i] for i, *_ in jobs]))
        for (i, j, _, _), [s2] in zip(jobs, outs, strict=True):
            plans[i][j]["s2"] = s2
    return [[_join(p, think) for p in row] for row in plans]


def _join(plan: dict, think: Thinking) -> GenSample:
    s1, s2, forced = plan["s1"], plan.get("s2"), plan["forced"]
    ids2 = list(s2.token_ids) if s2 else []
    ids = list(s1.token_ids) + forced + ids2
    mask = [1] * len(s1.token_ids) + [0] * len(forced) + [1] * len(ids2)
    lps = None
    if s1.logprobs is not None and (s2 is None or s2.logprobs is not None):
        lps = list(s1.logprobs) + [None] * len(forced) + (list(s2.logprobs) if s2 else [])
    text = s1.text + (think.close_text if forced else "") + (s2.text if s2 else "")
    extra = {**s1.extra, **(s2.extra if s2 else {}), "sampled_mask": mask, "think_tokens": plan["think"],
             "answer_tokens": len(s1.token_ids) - plan["think"] + len(ids2), "forced_tokens": len(forced),
             "think_overflow": plan["overflow"] or bool(forced)}
    return GenSample(token_ids=ids, text=text, logprobs=lps, finish_reason=(s2 or s1).finish_reason, extra=extra)


class ThinkingBackend:
    """A backend whose every ``generate`` is two-phase: for callers that take a backend and make
    their own calls (the eval harness adapters). Everything else is the wrapped backend's."""

    def __init__(self, backend: Any, think: Thinking) -> None:
        self.backend, self.think = backend, think

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None, keys: list[str] | None = None) -> list[list[GenSample]]:
        return generate_thinking(self.backend, prompts, n, sampling, self.think, seeds=seeds, keys=keys)


def unanswered(sample: GenSample) -> bool:
    """The reply ended inside its reasoning (``end`` overflow, or EOS in an open block): it has no
    answer, so its text must not be read as one."""
    return bool(sample.extra.get("think_overflow")) and not sample.extra.get("forced_tokens")


# -- earlier reasoning in the context ----------------------------------------------------------

CONTEXTS = ("keep", "drop", "auto")
_PROBE = "spade-probe-reasoning"


def answer_only(content: str) -> str:
    """An assistant message without its reasoning, as Qwen3's template writes earlier turns:
    what follows the last ``</think>``, leading newlines removed; an unclosed block leaves what
    came before it."""
    if "</think>" in content:
        return content.split("</think>")[-1].lstrip("\n")
    return content.split("<think>", 1)[0] if "<think>" in content else content


def template_drops_reasoning(tokenizer: Any, enable_thinking: bool = True) -> bool:
    """Whether the chat template removes the reasoning of an earlier assistant turn."""
    chat = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": f"<think>\n{_PROBE}\n</think>\n\na"},
            {"role": "user", "content": "r"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)
    return _PROBE not in text


def resolve_think_context(tokenizer: Any, cfg: Any) -> str:
    """``keep`` or ``drop`` for ``cfg.think_context`` (``auto``: what the template does)."""
    from spade_cli.core.artifacts import SpadeError

    mode = getattr(cfg, "think_context", "auto")
    if mode not in CONTEXTS:
        raise SpadeError(f"think context must be one of {', '.join(CONTEXTS)}, got {mode!r}")
    if mode != "auto":
        return mode
    return "drop" if template_drops_reasoning(tokenizer, getattr(cfg, "thinking", True)) else "keep"
