"""Is a Hugging Face checkpoint directory complete? Checked before any stage loads one.

A checkpoint cut short (a copy or a download that stopped, a disk that filled) otherwise fails deep
inside transformers or safetensors with a traceback, or worse, is copied on as if it were whole.
``check`` reads only what is cheap: ``config.json`` (present and a JSON object), the weights files
(``model.safetensors``, or ``model.safetensors.index.json`` and every shard it names, or a legacy
``pytorch_model.bin``), and each safetensors file's header: its declared length fits the file,
it parses, every tensor's byte range matches its dtype and shape, and the data section ends exactly
where the file does (the check safetensors itself makes when it opens the file, without reading any
tensor). An index's tensors must each be in the header of the shard it names.

A path that is not a directory (a hub id) is left to the loader.

    check("runs/demo/ckpt/iter_0003")   # raises InputError naming the file and what is wrong
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from spade_cli.core.errors import InputError

# Bytes per element of safetensors' dtype names.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
                "C64": 8}
_MAX_HEADER = 100 << 20  # safetensors' own limit on the header's size


def safetensors_header(path: Path) -> dict:
    """The parsed header of a safetensors file, after checking that the file holds every byte of
    every tensor it declares; raises ``InputError`` naming the file otherwise."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise InputError(path, None, f"truncated safetensors file ({size} bytes, not even a header)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise InputError(path, None, f"truncated safetensors file: its header declares {n} bytes, "
                                             f"the file has {size}")
            raw = fh.read(n)
    except OSError as exc:
        raise InputError(path, None, f"unreadable ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise InputError(path, None, "the safetensors header is not valid JSON (a damaged file)") from None
    if not isinstance(header, dict):
        raise InputError(path, None, "the safetensors header is not a JSON object (a damaged file)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
            want = math.prod(info["shape"]) * _DTYPE_BYTES.get(info["dtype"], 0)
        except (TypeError, KeyError, ValueError):
            raise InputError(path, None, f"tensor {name!r} has a malformed header entry") from None
        if info["dtype"] in _DTYPE_BYTES and stop - begin != want:
            raise InputError(path, None, f"tensor {name!r} spans {stop - begin} bytes, its dtype and shape "
                                         f"need {want}")
        end = max(end, stop)
    data = size - 8 - n
    if data != end:
        raise InputError(path, None, f"truncated safetensors file: its tensors need {end} bytes of data, "
                                     f"the file holds {data}" if data < end else
                                     f"{data - end} bytes follow the last tensor (a damaged file)")
    return header


def _config(directory: Path) -> None:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(directory, None, "not a complete checkpoint: config.json is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(path, None, f"unreadable or not JSON ({exc}): the checkpoint is damaged") from None
    if not isinstance(config, dict):
        raise InputError(path, None, "not a JSON object: the checkpoint is damaged")


def _sharded(directory: Path, index: Path) -> None:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise InputError(index, None, "not a safetensors index (a JSON object with a weight_map of file "
                                      "names): the checkpoint is damaged") from None
    headers = {}
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        if Path(shard).name != shard or not path.is_file():
            raise InputError(index, None, f"names the shard {shard!r}, which is not in {directory}: the "
                                          "checkpoint is incomplete")
        headers[shard] = safetensors_header(path)
    for tensor, shard in weight_map.items():
        if tensor not in headers[shard]:
            raise InputError(directory / shard, None, f"lacks the tensor {tensor!r} that {index.name} puts there")


def check(path: str | Path) -> None:
    """Raise ``InputError`` unless ``path`` is a complete checkpoint directory (or not a directory)."""
    directory = Path(path)
    if not directory.is_dir():
        return
    _config(directory)
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        safetensors_header(single)
    elif index.is_file():
        _sharded(directory, index)
    elif not any((directory / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise InputError(directory, None, "not a complete checkpoint: no weights (model.safetensors or "
                                          "model.safetensors.index.json)")
