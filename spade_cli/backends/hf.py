"""The ``hf`` backend: transformers ``generate`` over token-id prompts (CPU, tests, small runs).

Every prompt is repeated ``n`` times and all rows go through ``model.generate`` together, left
padded, in as few calls as ``batch_size`` allows (one call for a design batch of 24 rows by
default). ``calls`` counts the ``generate`` calls so tests and benchmarks can check batching.

Sampling follows ``Sampling`` only: the checkpoint's own ``generation_config`` (Qwen3 ships
``top_k=20, top_p=0.95, temperature=0.6``) is replaced by a neutral one at load time, so the
hf, vllm and openai backends draw from the same distribution for the same ``Sampling``.

Log-probabilities are those of the sampler: ``log_softmax`` of the processed logits (divided by
the temperature, then top-p filtered) at the chosen token. With ``top_p < 1`` that is the
renormalised nucleus distribution, the same quantity as vLLM's ``processed_logprobs``. Rather
than keeping ``output_scores`` (batch x steps x vocab floats: gigabytes with a 150k vocabulary),
spade applies temperature and top-p itself as the last logits processors and a recorder after
them keeps one gathered value per row and step. With ``temperature == 0`` decoding is greedy and
the log-probs are those of the untempered distribution.

A row ends at the first EOS token, which stays in ``token_ids`` (and its log-prob in
``logprobs``) so training sees the model decide to stop; ``text`` is decoded without special
tokens. A stop string ends a row at the token that completes it: the tokens up to and including
that one are kept (they were sampled), ``text`` is cut before the stop string, as vLLM does with
``include_stop_str_in_output=False``. Both give ``finish_reason == "stop"``; running out of
``max_tokens`` gives ``"length"``.

Seeds: with ``Sampling.seed`` set, the torch RNG is forked and seeded around each call, so the
same prompts, ``n``, sampling and batch size reproduce the same samples (a different batch
composition changes which random numbers a row draws). With ``seed=None`` the global RNG is used.
With per-prompt ``seeds``, each row draws its token with its own generator (Gumbel-max over the
same processed scores), so a row's sample no longer depends on the rest of the batch: a resumed
rollout or design reproduces the uninterrupted run.

    backend = HFBackend("ckpt/tiny", dtype="float32")
    [[a, b]] = backend.generate([ids], n=2, sampling=Sampling(temperature=0.7, max_tokens=64, seed=0))
"""

from __future__ import annotations

import contextlib
from typing import Any

from spade_cli.backends import GenSample, Sampling, sample_seed

DTYPES = ("float32", "bfloat16", "float16", "auto")


def _pick_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class _Recorder:
    """The last logits processor: keeps the log-prob of each token the sampler chose.

    At step t it sees the processed scores of step t; the token chosen from them only appears in
    ``input_ids`` at step t+1, so it holds one (batch, vocab) log-softmax and gathers from it on
    the next call. ``finalize`` gathers the last step from the finished sequences.
    """

    def __init__(self) -> None:
        self.prev: Any = None
        self.steps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finalize(self, sequences: Any, prompt_len: int) -> Any:
        import torch

        generated = sequences.shape[1] - prompt_len
        # generate may run one step more than it keeps (deferred stop checks): cut to what it kept.
        steps = self.steps[:generated]
        if len(steps) < generated and self.prev is not None:
            steps.append(self.prev.gather(1, sequences[:, prompt_len + len(steps)][:, None]).squeeze(1))
        self.prev = None
        if not steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(steps, dim=1).cpu()


class _RowSampler:
    """After the recorder, when rows carry their own seeds: draws each row's token with that row's
    own generator (Gumbel-max over the processed scores, the same distribution generate samples
    from) and leaves only that token possible, so a row's sample does not depend on the batch."""

    def __init__(self, seeds: list[int], device: str) -> None:
        import torch

        self.gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        out = torch.full_like(scores, float("-inf"))
        for i, gen in enumerate(self.gens):
            u = torch.rand(scores.shape[1], generator=gen, device=scores.device).clamp_(1e-20, 1.0)
            out[i, torch.argmax(scores[i].float() - torch.log(-torch.log(u)))] = 0.0
        return out


class HFBackend:
    """transformers ``generate`` behind the spade ``Backend`` interface."""

    name = "hf"
    logprobs_mode = "processed"  # recorded after spade's own temperature and top-p processors

    def __init__(self, model: str, dtype: str = "float32", device: str | None = None,
                 batch_size: int = 64, **_: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        from spade_cli.core import checkpoint
        from spade_cli.core.artifacts import SpadeError

        if dtype not in DTYPES:
            raise SpadeError(f"hf backend: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        self.model = str(model)
        checkpoint.check(self.model)  # a truncated checkpoint: one line, not a safetensors traceback
        self.device = _pick_device(device)
        self.batch_size = max(1, int(batch_size))
        self.calls = 0
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.lm = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch_dtype).to(self.device).eval()

        eos: set[int] = set()
        for source in (self.lm.generation_config.eos_token_id, self.lm.config.eos_token_id,
                       self.tokenizer.eos_token_id):
            if source is not None:
                eos.update(source if isinstance(source, list | tuple) else [source])
        if not eos:
            raise SpadeError(f"hf backend: {self.model} defines no EOS token")
        self.eos_ids = sorted(eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        # Neutral defaults (no temperature, top-k, top-p or penalties): only Sampling decides, and
        # generate's own warpers stay off so the recorder sees the final distribution.
        self.lm.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None) -> list[list[GenSample]]:
        """For every prompt, ``n`` samples; rows are batched across prompts and samples."""
        import torch

        rows = [list(p) for p in prompts for _ in range(n)]
        row_seeds = [sample_seed(s, j) for s in seeds for j in range(n)] if seeds is not None else None
        if row_seeds is not None and len(row_seeds) != len(rows):
            raise ValueError(f"{len(seeds or [])} seeds for {len(prompts)} prompts")
        outs: list[GenSample] = []
        rng = torch.random.fork_rng(devices=[self.device] if self.device.startswith("cuda") else [])
        with rng if sampling.seed is not None else contextlib.nullcontext():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), self.batch_size):
                part = slice(start, start + self.batch_size)
                outs.extend(self._generate_batch(rows[part], sampling, row_seeds[part] if row_seeds else None))
        return [outs[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, rows: list[list[int]], sampling: Sampling,
                        row_seeds: list[int] | None = None) -> list[GenSample]:
        import torch
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        if not rows:
            return []
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every row's next token sits in the last column
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1

        greedy = sampling.temperature <= 0
        recorder = _Recorder()
        processors = []
        if not greedy:
            # Our own warpers, so the recorder runs after them (custom processors precede built-ins).
            if sampling.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                processors.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                processors.append(TopPLogitsWarper(sampling.top_p))
        processors.append(recorder)
        if row_seeds is not None and not greedy:
            processors.append(_RowSampler(row_seeds, self.device))
        kwargs: dict[str, Any] = {}
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.inference_mode():
            seqs = self.lm.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                logits_processor=LogitsProcessorList(processors), do_sample=not greedy,
                max_new_tokens=sampling.max_tokens,
                eos_token_id=self.eos_ids + [t for t in sampling.stop_token_ids if t not in self.eos_ids],
                pad_token_id=self.pad_id, **kwargs)
        self.calls += 1
        lps = recorder.finalize(seqs, width)
        gen = seqs[:, width:].cpu()
        return [self._finish(gen[i].tolist(), lps[i].tolist(), sampling) for i in range(len(rows))]

    def _finish(self, tokens: list[int], logprobs: list[float], sampling: Sampling) -> GenSample:
        """Cut one generated row at its first EOS or stop string; everything after is padding."""
        finish = "length"
        eos = set(self.eos_ids)
        stops = eos | set(sampling.stop_token_ids)
        for j, tok in enumerate(tokens):
            if tok in stops:
                tokens, logprobs, finish = tokens[:j + 1], logprobs[:j + 1], "stop"
                break
        body = tokens[:-1] if finish == "stop" and tokens[-1] in eos else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        cut = _first_stop(text, sampling.stop)
        if cut is not None:
            k = _tokens_covering(self.tokenizer, body, cut[1])
            tokens, logprobs, text, finish = body[:k], logprobs[:k], text[:cut[0]], "stop"
        return GenSample(token_ids=tokens, text=text, logprobs=logprobs, finish_reason=finish)

    def close(self) -> None:
        self.lm = None


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, int] | None:
    """(start, end) of the earliest stop string in ``text``, or None."""
    best: tuple[int, int] | None = None
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(s))
    return best


def _tokens_covering(tokenizer: Any, tokens: list[int], end: int) -> int:
    """Smallest k such that decode(tokens[:k]) reaches ``end`` characters (binary search)."""
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(tokens[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo
