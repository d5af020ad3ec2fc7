"""The ``openai`` backend: any OpenAI-compatible server (``vllm serve``, SGLang, ``transformers serve``).

spade renders chats itself, so this backend only uses the legacy ``POST {base_url}/completions``
route, which takes a raw prompt and never applies a chat template. Two wire modes:

* **token mode** (vLLM): the prompt is the list of token ids and the request asks for
  ``return_token_ids`` and ``logprobs: 1``. The answer carries the sampled ``token_ids`` and the
  sampler's ``token_logprobs``: exact prompts, exact completions, log-probs at the sampling
  temperature when the server runs with ``--logprobs-mode processed_logprobs``. One request per
  prompt carries all ``n`` samples.
* **text mode** (everything else, e.g. ``transformers serve``, whose ``/v1/completions`` takes a
  string, ignores ``n`` and ``logprobs`` and rejects unknown fields with 422): the prompt ids are
  decoded (special tokens kept) and sent as text, one request per sample, and the returned text
  is re-tokenized with the local tokenizer. ``logprobs`` is then None (unknown: the trainer must
  recompute and treat the samples as on-policy) and ``extra["retokenized"]`` is True.

The mode is found once per backend: the first request goes out in token mode; a 400/404/422
answer, or an answer without ``token_ids``, switches this backend to text mode for good
(``token_prompts=True/False`` skips the probe).

Text mode is faithful to the prompt as long as decode-then-encode round-trips, which holds for
chat-template renderings (they are tokenizations of text) but not always for spliced multi-turn
ids or for completions that end inside a multi-byte character. A stop string found in the
returned text is cut (``transformers serve`` keeps it, vLLM does not). When a sample ended with
``finish_reason == "stop"`` and no stop string explains it, the EOS id is appended to the
re-tokenized ids, mirroring the hf and vllm backends which keep the sampled EOS.

Seeds: token mode sends ``seed`` with each request (vLLM then draws ``n`` distinct samples);
text mode sends ``seed + j`` for sample ``j`` so separate requests do not repeat one sample.
``transformers serve`` seeds a global RNG per request, so its results are reproducible only with
``concurrency=1``.

Which checkpoint, which log-probs. A server outlives the stages that sample from it, so before
sampling a stage checks (``check_server``) that the server serves the checkpoint it was told to
sample from: vLLM lists each served name with its ``root`` (the path it loaded) at ``GET
/v1/models``; a root that is not ``--model`` is refused (a stale server would make the run
off-policy) unless the stage accepts a foreign server, which its manifest records. The served
name is read from the same list, so a server with a fixed name (``spade serve``) follows the loop
while ``--model`` names each iteration's checkpoint. A server that lists no root (``transformers
serve``, or one whose ``/v1/models`` fails) cannot be checked; the manifest says ``verified: false``.

``logprobs_mode`` says what the log-probs are: ``none`` in text mode; in token mode one probe
request with ``top_k: 1`` tells them apart, since the sampler's (processed) log-prob of the only
token top-k 1 leaves is exactly 0 while the model's raw one is below 0.

Data-parallel servers. Behind one ``vllm serve --data-parallel-size N`` the engines are balanced
by load, and each engine has its own prefix cache: an episode whose turns (and whose reasoning and
answer requests) land on different engines re-reads its whole context on each. vLLM pins a request
to an engine with the ``X-data-parallel-rank`` header, so every request carries one: its key's
hash modulo N (``dp_rank``). ``generate(keys=...)`` names the keys (the rollout engine passes the
episode id, so all of an episode's requests go to one engine and the episodes spread over all of
them); without keys a prompt's own content is its key. N comes from ``data_parallel_size=`` or
from the server: ``GET /server_info?config_format=json`` (vLLM's development routes, which ``spade
serve`` turns on), else the ``engine`` labels of ``GET /metrics``; a server that says neither gets
no header (N = 1). The manifest records N.

    backend = OpenAIBackend("ckpt/tiny", base_url="http://127.0.0.1:8000/v1", concurrency=8)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spade_cli.backends import GenSample, Sampling, prompt_key, sample_seed
from spade_cli.core.artifacts import SpadeError

_REJECTED = (400, 404, 415, 422)  # what servers answer to a token-list prompt or unknown fields


class OpenAIBackend:
    """HTTP client for ``/v1/completions``; ``calls`` counts ``generate`` calls, ``requests`` HTTP posts."""

    name = "openai"
    # The server batches whatever requests are in flight, so `spade rollout` lets each episode
    # advance on its own (continuous batching) instead of waiting for the slowest reply of a tick.
    continuous = True
    routes_by_key = True  # generate(keys=...): one data-parallel engine per key

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8000/v1", api_key: str | None = None,
                 concurrency: int = 8, timeout: float = 600.0, served_model: str | None = None,
                 token_prompts: bool | None = None, retries: int = 2, data_parallel_size: int | None = None,
                 **_: Any) -> None:
        from transformers import AutoTokenizer

        self.model = str(model)
        self.served_model = served_model or self.model
        url = (base_url or "http://127.0.0.1:8000/v1").rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.concurrency = max(1, int(concurrency))
        self.timeout = float(timeout)
        self.token_prompts = token_prompts
        self.retries = max(0, int(retries))
        self.calls = 0
        self.requests = 0
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.eos_id = self.tokenizer.eos_token_id
        self._named = served_model is not None
        self._logprobs_mode: str | None = None
        self.server: dict[str, Any] = {"url": self.base_url}
        self.data_parallel_size = data_parallel_size
        self._dp_lock = threading.Lock()

    # -- what the server serves ---------------------------------------------------------------

    def _get(self, route: str, root: bool = False, raw: bool = False) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = (self.base_url.removesuffix("/v1") if root else self.base_url) + route
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=min(self.timeout, 30.0)) as resp:
            body = resp.read(4 << 20)
        return body.decode("utf-8", "replace") if raw else json.loads(body)

    def dp_size(self) -> int:
        """The server's data-parallel engines (learned once; 1 when it does not say)."""
        with self._dp_lock:
            if self.data_parallel_size is None:
                self.data_parallel_size = self._learn_dp()
            return self.data_parallel_size

    def _learn_dp(self) -> int:
        try:
            info = self._get("/server_info?config_format=json", root=True)
            size = info["vllm_config"]["parallel_config"]["data_parallel_size"]
            if isinstance(size, int) and size >= 1:
                return size
        except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
            pass
        try:  # every engine labels vLLM's metrics with its rank
            ranks = ENGINE_LABEL.findall(self._get("/metrics", root=True, raw=True))
        except (OSError, urllib.error.URLError):
            return 1
        return max(map(int, ranks)) + 1 if ranks else 1

    def check_server(self, accept_foreign: bool = False) -> dict:
        """Refuse a server that does not serve ``model`` (unless ``accept_foreign``); returns what the
        manifest records: url, served name, the checkpoint it serves, verified or not."""
        try:
            listed = [m for m in self._get("/models").get("data", []) if isinstance(m, dict)]
        except (urllib.error.HTTPError, ValueError, AttributeError) as exc:
            # it answers but lists nothing usable (transformers serve offline answers 500): unchecked
            self.server = {"url": self.base_url, "served_model": self.served_model, "checkpoint": None,
                           "verified": False, "accepted_foreign": False, "unlisted": str(exc)[:200]}
            return self.server
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise SpadeError(f"openai backend: cannot reach {self.base_url} ({exc}); is the server up?") from None
        if not self._named and len(listed) == 1 and listed[0].get("id"):
            self.served_model = str(listed[0]["id"])  # a server's fixed name (spade serve)
        entry = next((m for m in listed if m.get("id") == self.served_model), None)
        if entry is None:
            names = ", ".join(str(m.get("id")) for m in listed) or "nothing"
            raise SpadeError(f"openai backend: {self.base_url} does not serve {self.served_model!r} (it serves "
                             f"{names}); pass --model the checkpoint it serves")
        root = entry.get("root")
        verified = isinstance(root, str) and same_checkpoint(root, self.model)
        # a link (spade serve's RUN/serve/current) names the checkpoint it points to
        held = os.path.realpath(root) if isinstance(root, str) and Path(root).exists() else root
        self.server = {"url": self.base_url, "served_model": self.served_model, "checkpoint": held,
                       "verified": verified, "accepted_foreign": False, "data_parallel_size": self.dp_size()}
        if isinstance(root, str) and not verified:
            if not accept_foreign:
                raise SpadeError(f"openai backend: {self.base_url} serves the checkpoint {held}, not --model "
                                 f"{self.model}: its samples would be off-policy. Load the checkpoint into the "
                                 "server (spade serve --model ... reloads it), or pass --foreign-server to "
                                 "sample from it anyway (recorded in the manifest)")
            self.server["accepted_foreign"] = True
        return self.server

    @property
    def logprobs_mode(self) -> str:
        """``processed`` (the sampler's), ``raw`` (the model's) or ``none`` (text mode); probed once."""
        if self._logprobs_mode is None:
            self._logprobs_mode = self._probe_logprobs()
        return self._logprobs_mode

    def _probe_logprobs(self) -> str:
        if self.token_prompts is False:
            return "none"
        prompt = list(self.tokenizer.encode("Hello", add_special_tokens=False)) or [self.eos_id or 0]
        probe = Sampling(temperature=1.0, max_tokens=1, top_k=1, seed=0)
        group = self._token_request(prompt, 1, probe)
        if group is None:
            self.token_prompts = False
            return "none"
        self.token_prompts = True
        lps = group[0].logprobs
        if not lps:
            return "none"
        return "processed" if abs(lps[0]) < 1e-6 else "raw"

    # -- HTTP ---------------------------------------------------------------------------------

    def _post(self, body: dict, key: str | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        size = self.dp_size()
        if size > 1:  # pin the request to one engine: the one that holds this key's prefix
            headers["X-data-parallel-rank"] = str(dp_rank(key or prompt_key(body.get("prompt") or []), size))
        req = urllib.request.Request(self.base_url + "/completions", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        self.requests += 1
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:500].decode("utf-8", "replace")
                if exc.code < 500 or attempt == self.retries:
                    raise _HTTPStatus(exc.code, f"{self.base_url}/completions answered {exc.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.retries:
                    raise SpadeError(f"openai backend: cannot reach {self.base_url}: {exc}") from None
            time.sleep(2 ** attempt)  # an overloaded or restarting server: back off, then retry
        raise AssertionError("unreachable")

    def _common(self, sampling: Sampling) -> dict:
        body: dict[str, Any] = {"model": self.served_model, "max_tokens": sampling.max_tokens,
                                "temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        stops = list(sampling.stop)
        if sampling.stop_token_ids:
            if self.token_prompts is False:  # text servers know no stop ids: stop at their text
                stops += [self._id_text(t) for t in sampling.stop_token_ids]
            else:
                body["stop_token_ids"] = list(sampling.stop_token_ids)
        if stops:
            body["stop"] = stops
        return body

    def _id_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # -- the two wire modes -------------------------------------------------------------------

    def _token_request(self, prompt: list[int], n: int, sampling: Sampling,
                       seed: int | None = None, key: str | None = None) -> list[GenSample] | None:
        """All n samples of one prompt in token mode; None when the server does not speak it."""
        body = {**self._common(sampling), "prompt": prompt, "n": n, "logprobs": 1, "return_token_ids": True}
        seed = sampling.seed if seed is None else seed
        if seed is not None:
            body["seed"] = seed
        try:
            answer = self._post(body, key or prompt_key(prompt))
        except _HTTPStatus as exc:
            if exc.status in _REJECTED and self.token_prompts is None:
                return None
            raise
        choices = sorted(answer.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != n or any(c.get("token_ids") is None for c in choices):
            return None
        return [self._from_tokens(c, sampling) for c in choices]

    def _text_request(self, prompt: list[int], j: int, sampling: Sampling,
                      seed: int | None = None, key: str | None = None) -> GenSample:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        body = {**self._common(sampling), "prompt": text}
        if seed is not None:
            body["seed"] = sample_seed(seed, j)
        elif sampling.seed is not None:
            body["seed"] = sampling.seed + j
        [choice, *_] = self._post(body, key or prompt_key(prompt))["choices"]
        return self._from_text(choice, sampling)

    def _from_tokens(self, choice: dict, sampling: Sampling) -> GenSample:
        ids = [int(t) for t in choice["token_ids"]]
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if lps is not None and (len(lps) != len(ids) or any(x is None for x in lps)):
            lps = None
        text = choice.get("text") or ""
        cut = _first_stop(text, sampling.stop)
        return GenSample(token_ids=ids, text=text if cut is None else text[:cut],
                         logprobs=[float(x) for x in lps] if lps is not None else None,
                         finish_reason=_finish(choice), extra={"stop_reason": choice.get("stop_reason")})

    def _from_text(self, choice: dict, sampling: Sampling) -> GenSample:
        text = choice.get("text") or ""
        finish = _finish(choice)
        id_stops = {self._id_text(t): t for t in sampling.stop_token_ids}
        cut = _first_stop(text, sampling.stop)
        hit = _first_stop(text, tuple(id_stops))
        stopped_at_id = None
        if hit is not None and (cut is None or hit <= cut):  # the stop id is kept, as the others do
            stopped_at_id = next(t for s, t in id_stops.items() if text.startswith(s, hit))
            text, finish, cut = text[:hit], "stop", hit
        elif cut is not None:
            text, finish = text[:cut], "stop"
        elif choice.get("stop_reason") in id_stops:  # the server cut the stop text off itself
            stopped_at_id, cut = id_stops[choice["stop_reason"]], len(text)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if stopped_at_id is not None:
            ids.append(stopped_at_id)
        elif finish == "stop" and cut is None and choice.get("stop_reason") is None and self.eos_id is not None:
            ids.append(self.eos_id)
        return GenSample(token_ids=ids, text=text, logprobs=None, finish_reason=finish,
                         extra={"retokenized": True})

    # -- Backend interface --------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], n: int, sampling: Sampling,
                 seeds: list[int] | None = None, keys: list[str] | None = None) -> list[list[GenSample]]:
        """For every prompt, ``n`` samples; requests run ``concurrency`` at a time. With ``seeds``
        each prompt's request carries its own seed; with ``keys`` the prompts of one key go to one
        data-parallel engine of the server."""
        self.calls += 1
        if not prompts:
            return []
        seed_of = (lambda i: seeds[i]) if seeds is not None else (lambda i: None)
        key_of = (lambda i: keys[i]) if keys is not None else (lambda i: None)
        out: list[list[GenSample] | None] = [None] * len(prompts)
        todo = list(range(len(prompts)))
        if self.token_prompts is None:  # probe once with the first prompt
            first = self._token_request(list(prompts[0]), n, sampling, seed_of(0), key_of(0))
            self.token_prompts = first is not None
            if first is not None:
                out[0], todo = first, todo[1:]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            if self.token_prompts:
                results = pool.map(
                    lambda i: self._token_request(list(prompts[i]), n, sampling, seed_of(i), key_of(i)), todo)
                for i, group in zip(todo, results, strict=True):
                    if group is None:
                        raise SpadeError(f"openai backend: {self.base_url} returned no token ids for prompt {i}")
                    out[i] = group
            else:
                jobs = [(i, j) for i in todo for j in range(n)]
                samples = list(pool.map(lambda ij: self._text_request(list(prompts[ij[0]]), ij[1], sampling,
                                                                      seed_of(ij[0]), key_of(ij[0])), jobs))
                for i in todo:
                    out[i] = samples[:n]
                    samples = samples[n:]
        return [group or [] for group in out]

    def close(self) -> None:
        pass


class _HTTPStatus(SpadeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# a vLLM metric sample of one engine: vllm:num_requests_running{engine="3",model_name="spade"} 0.0
ENGINE_LABEL = re.compile(r'^vllm:[^{\s]*\{[^}]*\bengine="(\d+)"', re.MULTILINE)


def dp_rank(key: str, size: int) -> int:
    """The data-parallel engine of ``key`` among ``size``: the same for every request of the key,
    spread evenly over the engines across keys."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % size


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two names point at one checkpoint: the same directory, or the same hub id."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return os.path.samefile(pa, pb)
    return a.rstrip("/") == b.rstrip("/")


def _finish(choice: dict) -> str:
    return "length" if choice.get("finish_reason") == "length" else "stop"


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
