#!/usr/bin/env bash
# The GPU check: spade's update and generation on one GPU without network, in parts that each
# report (recipes/gpu_check.py says what each part checks and which settings it reads).
#
#   python recipes/gpu_check.py wheels gpu_wheels      # first, on a networked CPU machine (docs/install.md)
#   WHEELS=gpu_wheels bash recipes/gpu_check.sh        # on the GPU machine, the folder beside the checkout
#   DRY=1 bash recipes/gpu_check.sh                    # the CPU path at toy sizes (what the tests run)
set -euo pipefail
# python3 first: the torch one on CUDA images
exec "${PYTHON:-$(command -v python3 || command -v python)}" "$(dirname "${BASH_SOURCE[0]}")/gpu_check.py" run
