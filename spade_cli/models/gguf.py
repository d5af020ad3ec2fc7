"""`spade init-model --from-gguf FILE`: a GGUF checkpoint turned into a plain HF checkpoint.

A real instruct model on a machine without hub access often comes as one GGUF file (a pip wheel,
a llama.cpp download). spade's stages want a ``save_pretrained`` directory that transformers, TRL
and vLLM load without extra packages, so this module reads the file with transformers' own GGUF
loader (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package; ``pip install
'spade[gguf]'``), which dequantises every tensor, and saves the result.

Dtype: float32 by default. Dequantising a Q4/Q8 block (an fp16 scale times a small integer, plus an
fp16 offset) is exact in float32, so the checkpoint holds the values the GGUF file means, and
float32 is what the hf backend computes in on a CPU. ``--dtype bfloat16`` halves the size (for a GPU
or a 4B model) at the cost of rounding those values.

The loader leaves a GGUF ``quantization_config`` on the model (and refuses ``save_pretrained``
with it); the weights are already plain tensors, so the quantizer and that config entry are
dropped, and the saved checkpoint loads without ``gguf`` installed. The tokenizer, its chat
template included, comes from the same file.

Example: ``spade init-model --from-gguf SmolLM2-135M-Instruct.Q4_1.gguf --out ckpt/smollm2``
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(gguf_file: str | Path, out: str | Path, dtype: str = "float32") -> dict:
    """Write ``out`` (a plain HF checkpoint) from ``gguf_file``; return a summary."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    src = Path(gguf_file).resolve()
    final = Path(out)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                     dtype=getattr(torch, dtype))
        # The tensors are dequantised already: what is left of GGUF is bookkeeping that would make
        # save_pretrained refuse and every later load look for the gguf package.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.dtype = dtype
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        if not tok.chat_template:
            raise ValueError(f"{src}: the file carries no chat template (tokenizer.chat_template)")
        model.generation_config = GenerationConfig(
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=True, temperature=1.0)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        params = sum(p.numel() for p in model.parameters())
        info = {"from_gguf": src.name, "gguf_sha256": sha256(src), "dtype": dtype, "params": params,
                "vocab": len(tok), "architecture": type(model).__name__}
        (tmp / "spade_init.json").write_text(json.dumps(info, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return {"out": str(final), **info}
