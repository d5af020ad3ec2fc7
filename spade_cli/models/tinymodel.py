"""`spade init-model`: a random-initialised Qwen3 checkpoint built fully offline.

Tests, the CPU quickstart and users without hub access need a model that every library in the
loop loads: transformers, TRL, lm-eval and vLLM (whose CPU kernels want head_dim 64). This module
trains a byte-level BPE tokenizer on text that ships with Python and spade's bundled data (so there
is no out-of-vocabulary byte and no download), attaches a Qwen3-style chat template with the ``<think>``
and tool-call tokens, and saves a ``Qwen3ForCausalLM`` with ``save_pretrained``.

The chat template keeps assistant messages verbatim (Qwen3's own template drops earlier
``<think>`` blocks). spade relies on this: the token ids of a multi-turn episode must equal the
tokenization of its final chat, which only holds when rendering never rewrites history.

Sizes: ``tiny`` (~0.4M parameters, a few seconds; tests) and ``small`` (~13M; the CPU quickstart).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Not "special": they must survive decode(skip_special_tokens=True), as in Qwen3.
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions. Their signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with \"name\" and \"arguments\" within "
    "<tool_call></tool_call> tags.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{{- (fn.arguments if fn.arguments is string else (fn.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

SIZES = {
    # head_dim 64 everywhere: vLLM's CPU attention kernels support it.
    "tiny": dict(vocab=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1),
    "small": dict(vocab=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=6, num_key_value_heads=2),
}


def training_text() -> list[str]:
    """Offline text for the tokenizer: spade's bundled data (corpus, example environments) and a few
    stdlib modules, so Python code, JSON and English prose are all represented. spade's own source
    is left out on purpose: the tokenizer, hence the tiny model, must not change with every commit."""
    import json as json_mod
    import string
    import textwrap

    data = Path(__file__).resolve().parents[1] / "data"
    files = sorted(f for f in data.glob("**/*") if f.suffix in (".py", ".hint", ".jsonl", ".txt", ".yaml"))
    files += [Path(m.__file__) for m in (json_mod, string, textwrap)]
    texts = []
    for f in files:
        if f.is_file() and f.stat().st_size < 2_000_000:
            try:
                texts.append(f.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                continue
    texts.append(CHAT_TEMPLATE)
    return texts


def build(out: str | Path, size: str = "tiny", seed: int = 0) -> dict:
    """Write the checkpoint into ``out`` and return a summary (parameters, vocab, files)."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    spec = dict(SIZES[size])
    final = Path(out)
    # Build beside the target and rename, so an interrupted build never looks like a checkpoint.
    out = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=spec.pop("vocab"), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", unk_token=None, padding_side="left",
                                     model_max_length=32768)
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    cfg = Qwen3Config(vocab_size=len(hf_tok), head_dim=64, max_position_embeddings=32768,
                      tie_word_embeddings=True, eos_token_id=hf_tok.eos_token_id,
                      pad_token_id=hf_tok.pad_token_id, bos_token_id=None, **spec)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id, do_sample=True, temperature=1.0)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"size": size, "params": params, "vocab": len(hf_tok), "seed": seed,
            "python": sys.version.split()[0]}
    (out / "spade_init.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(out, final)
    return {"out": str(final), **info}


def untie(src: str | Path, out: str | Path) -> Path:
    """A copy of ``src`` with an LM head of its own (float32), as Qwen3-8B and larger have: vLLM
    reloads such a checkpoint in place, where a tied one (this module's models, Qwen3 up to 4B)
    needs a restart (stages/serve.py). The tests and the serve benchmark swap checkpoints with it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    m.config.tie_word_embeddings = False
    m.lm_head.weight = torch.nn.Parameter(m.get_input_embeddings().weight.detach().clone())
    m.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return Path(out)
