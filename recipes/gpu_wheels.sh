#!/usr/bin/env bash
# gpu_wheels.sh — the wheels recipes/gpu_check.sh installs on a GPU image that has no network, in one
# folder of at most 64 MiB (what travels beside the checkout).
#
#   bash recipes/gpu_wheels.sh                          # -> gpu_wheels/, for the image's Python 3.12
#   PY_VERSION=3.11 bash recipes/gpu_wheels.sh /tmp/w   # for another Python
#
# Run from a networked CPU machine with spade installed in $PYTHON (torch is needed to build
# DeepSpeed's wheel). The image is assumed to hold torch, transformers, accelerate, numpy, pandas,
# pyarrow, typer, rich and the like (a CUDA PyTorch image), but no trl, deepspeed, datasets or vllm:
# the folder gets spade itself, what its update imports beyond that (trl, datasets and the two
# packages of datasets' own that such images lack, msgspec, transformers in spade's range), and
# DeepSpeed built as a pure-Python wheel (DS_BUILD_OPS=0: ZeRO-2 with torch's AdamW needs no
# compiled op) with its pydantic and hjson. Versions are those installed in $PYTHON (what the CPU
# tests ran), else the pins below. vllm (hundreds of MB) cannot travel: gpu_check skips it.
# Fails, naming the size, when the folder exceeds MAX_MIB; the folder is built beside its name and
# renamed, and a rerun replaces only a folder this script wrote (it holds GPU_WHEELS.txt).
set -euo pipefail

DIR="${1:-gpu_wheels}"
PYTHON="${PYTHON:-python}"
PY_VERSION="${PY_VERSION:-3.12}"
MAX_MIB="${MAX_MIB:-64}"
DEEPSPEED="${DEEPSPEED:-0.19.8}"
EXTRA="${EXTRA:-}"  # more requirements, space-separated (e.g. "regex==2026.12.2")
mkdir -p "$(dirname "$DIR")"
DIR="$(cd "$(dirname "$DIR")" && pwd)/$(basename "$DIR")"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for d in "$DIR" "$DIR.partial"; do
  if [[ -e $d && ! -f $d/GPU_WHEELS.txt ]]; then
    echo "gpu_wheels: $d exists and was not written by this script; give another folder" >&2
    exit 2
  fi
done
echo "gpu_wheels: into $DIR for Python $PY_VERSION, at most $MAX_MIB MiB, with $PYTHON" >&2

# name==version as installed in $PYTHON, else the fallback spec
pinned=$("$PYTHON" - <<'PY'
from importlib.metadata import PackageNotFoundError, version
wanted = {"trl": "trl>=1.16,<1.17", "transformers": "transformers>=5.20,<5.24", "datasets": "datasets>=5.2,<6",
          "dill": "dill<0.4.2", "multiprocess": "multiprocess<0.70.20", "msgspec": "msgspec>=0.18",
          "pydantic": "pydantic>=2", "pydantic-core": None, "annotated-types": "annotated-types",
          "typing-inspection": "typing-inspection", "hjson": "hjson"}
for name, spec in wanted.items():
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        if spec is None:  # must match pydantic's pin exactly: comes with it only from one environment
            raise SystemExit(f"{name} is not installed in this Python; install spade's dev extras first")
        print(spec)
PY
)
tmp="$DIR.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "written by recipes/gpu_wheels.sh for Python $PY_VERSION; install with recipes/gpu_check.sh (WHEELS=)" \
  >"$tmp/GPU_WHEELS.txt"

# spade itself, and DeepSpeed without prebuilt ops (its setup imports torch: no build isolation)
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp" . >&2
DS_BUILD_OPS=0 DS_ACCELERATOR=cuda "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp" \
  "deepspeed==$DEEPSPEED" >&2
# the rest as published wheels for the image's Python and platform, without their dependencies
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086  # the pins and EXTRA are lists of words
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  "${platforms[@]}" -d "$tmp" $pinned $EXTRA >&2

bytes=$(du -sb "$tmp" | cut -f1)
mib=$("$PYTHON" -c "print(f'{$bytes / 2**20:.1f}')")
(cd "$tmp" && ls -1 ./*.whl | sed 's|^\./||') >>"$tmp/GPU_WHEELS.txt"
if ((bytes > MAX_MIB * 1048576)); then
  echo "gpu_wheels: $mib MiB is over the limit of $MAX_MIB MiB; the wheels are kept in $tmp" >&2
  exit 1
fi
if [[ -e $DIR ]]; then
  mv "$DIR" "$DIR.old.$$"
  rm -rf "$DIR.old.$$"
fi
mv "$tmp" "$DIR"
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $mib MiB in $DIR (limit $MAX_MIB MiB)" >&2
echo "$mib"
