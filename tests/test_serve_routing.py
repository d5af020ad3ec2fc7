"""Requests to a data-parallel server go to the engine that holds their prefix (``X-data-parallel-rank``).

A real ``spade rollout --backend openai`` plays multi-turn episodes, each turn in two requests
(reasoning, then answer), through the stand-in vLLM server of tests/test_serve.py started by
``spade serve --data-parallel-size 4``. The stand-in logs each request's seed and rank header; the
seeds name the episode and turn (``turn_seed``), so the test knows which request was whose.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from spade_cli.backends import GenSample, Sampling, load_backend
from spade_cli.backends.openai import dp_rank
from spade_cli.rollout.seeds import turn_seed
from tests.conftest import run_spade
from tests.test_backend_openai import _VLLMShaped
from tests.test_rollout_envs import GUESS, validation_row, write_envs
from tests.test_serve import _calls, _free_port, _serve, untied
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)


@pytest.mark.integration
def test_an_episodes_requests_go_to_one_engine_and_episodes_spread_over_all(tiny_model, tmp_path,
                                                                           standin):  # noqa: F811
    from spade_cli.backends.thinking import _phase2_seed

    ckpt = untied(tiny_model, tmp_path / "run" / "ckpt" / "iter_0000")
    run = tmp_path / "run"
    url = _serve("--run-dir", run, "--model", ckpt, "--port", str(_free_port()), "--vllm-python", sys.executable,
                 "--data-parallel-size", "4", env=standin)["url"]
    try:
        envs = tmp_path / "validated.jsonl"
        write_envs(envs, [validation_row(GUESS)])
        out = tmp_path / "rollouts.jsonl"
        res = run_spade("rollout", "--model", ckpt, "--backend", "openai", "--base-url", url, "--envs", envs,
                        "--k", "4", "--max-turns", "3", "--think-tokens", "1", "--answer-tokens", "2",
                        "--out", out, env=standin)
        assert res.returncode == 0, res.stderr[-3000:]
    finally:
        _serve("--run-dir", run, "--do", "stop", env=standin)
    manifest = json.loads((tmp_path / "rollouts.jsonl.manifest.json").read_text())
    assert manifest["server"]["data_parallel_size"] == 4
    rank_of_seed = {c["body"]["seed"]: c["rank"] for c in _calls(standin)
                    if c.get("route") == "/v1/completions" and c["body"].get("top_k") != 1}  # not the probe
    episodes = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(episodes) == 8
    ranks = {}
    for ep in episodes:
        seeds = [turn_seed(ep["episode_id"], t) for t in range(len(ep["turns"]))]
        seeds += [_phase2_seed(s, 0) for s in seeds]  # the answer request of each turn
        assert len(ep["turns"]) == 3 and all(s in rank_of_seed for s in seeds), ep["episode_id"]
        got = {rank_of_seed[s] for s in seeds}
        assert got == {str(dp_rank(ep["episode_id"], 4))}, (ep["episode_id"], got)  # one engine per episode
        ranks[ep["episode_id"]] = got.pop()
    assert len(set(ranks.values())) >= 3, ranks  # and the episodes spread over the engines


class _OneToken:
    def generate(self, prompts: list, n: int, sampling: Sampling) -> list:
        return [[GenSample(token_ids=[1], text="x", logprobs=[-1.0], finish_reason="length") for _ in range(n)]]


class _Metrics(_VLLMShaped):
    """A vLLM without development routes: its data parallelism shows only in /metrics labels."""

    hf = _OneToken()
    seen: list[dict] = []
    ranks: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802
        code, text = (200, "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 0.0\n'
                                   for i in range(3))) if self.path == "/metrics" else (404, "{}")
        self.send_response(code)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text.encode())

    def do_POST(self) -> None:  # noqa: N802
        self.ranks.append(self.headers.get("X-data-parallel-rank"))
        super().do_POST()


@pytest.mark.integration
def test_the_engine_count_comes_from_metrics_and_a_prompt_without_key_is_its_own(tiny_model):
    _Metrics.ranks = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        backend = load_backend("openai", str(tiny_model), base_url=url, token_prompts=True)
        prompts = [[5, 6, 7], [8, 9], [5, 6, 7]]
        backend.generate(prompts, n=1, sampling=Sampling(max_tokens=1))
        first = list(_Metrics.ranks)
        backend.generate(prompts[:1], n=1, sampling=Sampling(max_tokens=1), keys=["episode-a"])
        single = load_backend("openai", str(tiny_model), base_url=url, token_prompts=True, data_parallel_size=1)
        single.generate(prompts[:1], n=1, sampling=Sampling(max_tokens=1))
    finally:
        server.shutdown()
    assert backend.dp_size() == 3
    want = sorted(str(dp_rank(backend_key, 3)) for backend_key in map(_key, prompts))
    assert sorted(first) == want  # by content: the same prompt, the same engine
    assert _Metrics.ranks[3] == str(dp_rank("episode-a", 3))
    assert _Metrics.ranks[4] is None  # one engine: no header


def _key(prompt: list[int]) -> str:
    from spade_cli.backends import prompt_key

    return prompt_key(prompt)


def test_dp_rank_spreads_keys_evenly():
    counts = [0] * 8
    for i in range(4000):
        counts[dp_rank(f"episode-{i}", 8)] += 1
    assert min(counts) > 400 and max(counts) < 600, counts
    assert all(dp_rank("same", 8) == dp_rank("same", 8) for _ in range(3))

