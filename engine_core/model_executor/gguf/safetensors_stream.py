"""A float32 safetensors file written one tensor at a time: a GGUF model's tensors are
dequantized one by one into it, so converting a file never holds more than one of them in float32
(a 7B model's float32 tensors, held together for safetensors' save_file, are 28 GB).

The format (safetensors' own): an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range in the data (and __metadata__), padded with spaces to a
multiple of 8 bytes, then the data. Every shape is known before any tensor is dequantized (the
GGUF header has them), so the header is written first and the data streamed after it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def write_streamed(path: Path, shapes: list[tuple[str, tuple[int, ...]]],
                   tensors: Iterable[tuple[str, Iterable[np.ndarray]]]) -> None:
    """path's safetensors file: float32 tensors named and shaped as `shapes`, their data from
    `tensors` in the same order, each as pieces of whole rows (ValueError where a tensor is not
    the one announced)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset,
                                                                               offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    expected = iter(shapes)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, pieces in tensors:
            want = next(expected, None)
            if want is None or want[0] != name:
                raise ValueError(f"tensor {name} is not the one the header announced: {want}")
            written = 0
            for piece in pieces:
                if tuple(piece.shape[1:]) != tuple(want[1][1:]):
                    raise ValueError(f"a piece of {name} is {piece.shape}, the tensor {want[1]}")
                f.write(np.ascontiguousarray(piece, dtype="<f4").tobytes())
                written += piece.size
            if written != math.prod(want[1]):
                raise ValueError(f"{name} got {written} values, its shape {want[1]} holds "
                                 f"{math.prod(want[1])}")
        left = next(expected, None)
        if left is not None:
            raise ValueError(f"tensor {left[0]} was announced but never written")
