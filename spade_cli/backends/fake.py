"""The ``fake`` backend: scripted completions for unit tests of the stages above the backends.

A stage test that needs to know exactly what "the model" wrote (a design with a sloppy fence, a
thinking block, a parse failure) uses this backend instead of a real model. Outputs come from
``outputs=[...]`` or, for tests that drive the real CLI in a subprocess, from a JSON list of
strings in the file named by ``$SPADE_FAKE_OUTPUTS``. They are handed out in order, one per
sample, cycling when the script runs out. With no script, each sample is ``"fake {i}"``.

The tokenizer is the model's own when ``model`` is a checkpoint directory, so prompts and token
ids are real; otherwise a byte-level stand-in (one id per UTF-8 byte, ids 0-255, EOS 256) that
also renders chats. Log-probs are a constant -1.0 per token so training code has numbers to use.

Test hooks for the rollout engine's continuous batching: ``reply(seed) -> str`` makes a sample
depend on its seed only (not on call order, which threads make arbitrary); ``delay`` seconds of
"generation" per call; ``in_flight`` / ``max_in_flight`` count concurrent calls; setting
``continuous = True`` on an instance makes ``spade rollout --batching auto`` choose continuous.

    backend = FakeBackend("ckpt/tiny", outputs=["```python\\nclass E: ...\\n```"])
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_cli.backends import GenSample, Sampling


class ByteTokenizer:
    """Just enough of a transformers tokenizer for tests without a checkpoint."""

    eos_token_id = 256
    pad_token_id = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True, add_generation_prompt: bool = True,
                            **_: Any) -> Any:
        text = "".join(f"<{m['role']}>{m.get('content') or ''}</{m['role']}>\n" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return self.encode(text) if tokenize else text


class FakeBackend:
    """Scripted outputs behind the ``Backend`` interface; ``calls`` counts ``generate`` calls."""

    name = "fake"
    continuous = False

    def __init__(self, model: str, outputs: list[str] | None = None, reply: Callable[[int], str] | None = None,
                 delay: float = 0.0, rendezvous: int = 0, **_: Any) -> None:
        self.model = str(model)
        self.calls = 0
        self.reply, self.delay = reply, delay
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        # ``rendezvous=k``: calls wait (10 s at most) until k are in flight at once, so a test of
        # concurrency sees k overlap whenever the caller allows it, however the threads are scheduled.
        self.rendezvous = rendezvous
        self._crowd = threading.Condition(self._lock)
        self.requests: list[tuple[list[list[int]], int, Sampling]] = []
        if outputs is None and os.environ.get("SPADE_FAKE_OUTPUTS"):
            outputs = json.loads(Path(os.environ["SPADE_FAKE_OUTPUTS"]).read_text())
        self.outputs = list(outputs or [])
        self._next = 0
        if Path(self.model, "config.json").exists():
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        else:
            self.tokenizer = ByteTokenizer()

    def _script(self) -> str:
        i = self._next
        self._next += 1
        return self.outputs[i % len(self.outputs)] if self.outputs else f"fake {i}"

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None) -> list[list[GenSample]]:
        with self._lock:
            self.calls += 1
            self.requests.append(([list(p) for p in prompts], n, sampling))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.max_in_flight < self.rendezvous:
                self._crowd.wait_for(lambda: self.max_in_flight >= self.rendezvous, timeout=10)
            self._crowd.notify_all()
        try:
            time.sleep(self.delay)
            if self.reply:  # outside the lock: a test's reply may wait for another episode
                return self._samples(prompts, n, sampling, seeds)
            with self._lock:  # the script is handed out in call order
                return self._samples(prompts, n, sampling, seeds)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _samples(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None) -> list[list[GenSample]]:
        out = []
        for i in range(len(prompts)):
            group = []
            for _ in range(n):
                text = self.reply(seeds[i] if seeds else 0) if self.reply else self._script()
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
                cut = next((k for k, t in enumerate(ids) if t in sampling.stop_token_ids), None)
                if cut is not None and cut < sampling.max_tokens:  # a stop id ends the sample, kept
                    ids, finish = ids[:cut + 1], "stop"
                else:
                    ids = ids[:sampling.max_tokens]
                    finish = "length" if len(ids) == sampling.max_tokens else "stop"
                group.append(GenSample(token_ids=ids, text=self.tokenizer.decode(ids), logprobs=[-1.0] * len(ids),
                                       finish_reason=finish))
            out.append(group)
        return out

    def close(self) -> None:
        pass
