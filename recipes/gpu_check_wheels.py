"""The wheels the GPU check installs on a GPU image that has no network, in one folder of at most
64 MiB (what travels beside the checkout).

    python recipes/gpu_check.py wheels gpu_wheels                    # for the image's Python 3.12
    python recipes/gpu_check.py wheels /tmp/w --py-version 3.11      # for another Python

Run from a networked CPU machine with the Python that has spade installed (torch is needed to build
DeepSpeed's wheel). The image is assumed to hold torch, transformers, accelerate, numpy, pandas,
pyarrow, typer, rich and the like (a CUDA PyTorch image), but no trl, deepspeed, datasets or vllm:
the folder gets spade itself, what its update imports beyond that (trl, datasets and the two
packages of datasets' own that such images lack, msgspec, transformers in spade's range), and
DeepSpeed built as a pure-Python wheel (DS_BUILD_OPS=0: ZeRO-2 with torch's AdamW needs no compiled
op) with its pydantic and hjson. Versions are those installed in this Python (what the CPU tests
ran), else the specs in WANTED. vllm (hundreds of MB) cannot travel: the check skips it. Fails,
naming the size, when the folder exceeds the limit; the folder is built beside its name and
renamed, and a rerun replaces only a folder this command wrote (it holds GPU_WHEELS.txt).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "GPU_WHEELS.txt"
# name: the spec when this Python lacks the package (None: must match pydantic's own pin exactly,
# so it comes only from the environment that holds that pydantic)
WANTED = {"trl": "trl>=1.16,<1.17", "transformers": "transformers>=5.20,<5.24", "datasets": "datasets>=5.2,<6",
          "dill": "dill<0.4.2", "multiprocess": "multiprocess<0.70.20", "msgspec": "msgspec>=0.18",
          "pydantic": "pydantic>=2", "pydantic-core": None, "annotated-types": "annotated-types",
          "typing-inspection": "typing-inspection", "hjson": "hjson"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def _pinned() -> list[str]:
    """name==version as installed here, else the fallback spec."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name, spec in WANTED.items():
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            if spec is None:
                raise SystemExit(f"gpu_wheels: {name} is not installed in this Python; install spade's dev "
                                 "extras first") from None
            out.append(spec)
    return out


def gather(folder: Path, py_version: str, max_mib: float, deepspeed: str, extra: list[str]) -> float:
    """Build and download the wheels into ``folder``; the folder's size in MiB."""
    folder = folder.absolute()
    tmp = folder.with_name(folder.name + ".partial")
    for d in (folder, tmp):
        if d.exists() and not (d / MARK).is_file():
            print(f"gpu_wheels: {d} exists and was not written by this script; give another folder",
                  file=sys.stderr)
            raise SystemExit(2)
    print(f"gpu_wheels: into {folder} for Python {py_version}, at most {max_mib:g} MiB, with {sys.executable}",
          file=sys.stderr)
    pinned = _pinned()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / MARK).write_text(f"written by recipes/gpu_check.py wheels for Python {py_version}; "
                            "install with recipes/gpu_check.sh (WHEELS=)\n")
    pip = [sys.executable, "-m", "pip"]
    # spade itself, and DeepSpeed without prebuilt ops (its setup imports torch: no build isolation)
    wheel = [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp)]
    subprocess.run([*wheel, "."], check=True, cwd=REPO, stdout=sys.stderr)
    subprocess.run([*wheel, f"deepspeed=={deepspeed}"], check=True, stdout=sys.stderr,
                   env={**os.environ, "DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cuda"})
    # the rest as published wheels for the image's Python and platform, without their dependencies
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", py_version,
                    "--implementation", "cp", *platforms, "-d", str(tmp), *pinned, *extra], check=True,
                   stdout=sys.stderr)
    wheels = sorted(p.name for p in tmp.glob("*.whl"))
    with open(tmp / MARK, "a") as f:
        f.write("".join(w + "\n" for w in wheels))
    mib = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) / 2**20
    if mib > max_mib:
        raise SystemExit(f"gpu_wheels: {mib:.1f} MiB is over the limit of {max_mib:g} MiB; the wheels are kept in {tmp}")
    if folder.exists():  # written by this command (checked above): replaced whole
        old = folder.with_name(f"{folder.name}.old.{os.getpid()}")
        folder.rename(old)
        shutil.rmtree(old)
    tmp.rename(folder)
    print(f"gpu_wheels: {len(wheels)} wheels, {mib:.1f} MiB in {folder} (limit {max_mib:g} MiB)", file=sys.stderr)
    return round(mib, 1)
