"""A GGUF file's tensor table, read without decoding its metadata.

gguf's GGUFReader decodes every metadata value on opening a file, the vocabulary's strings
included: 1.6 s for SmolLM2's 49152 tokens, paid again by every reader of the weights. The
tensors need none of it but the data alignment, so this walks past the key-value section
(each string's length read, its bytes skipped) and reads the tensor infos only. The tensors it
gives carry what the loader uses of GGUFReader's (name, tensor_type, shape in GGUF order, data
as a memory-mapped view shaped as GGUFReader shapes it), and equal them (tests/engine_core/model_executor).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from strand.platform.page_release import release_range

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
# Fixed sizes of the metadata value types (gguf's GGUFValueType: 8 is a string, 9 an array).
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_ALIGNMENT_KEY = "general.alignment"
_DEFAULT_ALIGNMENT = 32
# Types whose data GGUFReader gives as numbers rather than bytes.
_NUMERIC = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
            "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray  # GGUF order: the row length first
    data: np.ndarray


class _Cursor:
    def __init__(self, raw: np.ndarray, path: Path) -> None:
        self.raw, self.pos, self.path = memoryview(cast(Any, raw)), 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.raw):
            raise ValueError(f"{self.path} ends inside its GGUF header (at byte {self.pos})")
        values = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.take("<Q")
        text = bytes(self.raw[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def skip_value(self, value_type: int) -> None:
        if value_type == _STRING:
            n = self.take("<Q")  # read before the sum: take moves pos
            self.pos += n
        elif value_type == _ARRAY:
            item_type, count = self.take("<IQ")
            if item_type in _SIZES:
                self.pos += _SIZES[item_type] * count
            else:
                for _ in range(count):
                    self.skip_value(item_type)
        elif value_type in _SIZES:
            self.pos += _SIZES[value_type]
        else:
            raise ValueError(f"{self.path}: unknown GGUF metadata value type {value_type}")


def read_tensors(path: str | Path) -> list[GGUFTensor]:
    """The tensors of a GGUF file (little-endian, version 2 or 3), their data memory-mapped."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    raw = np.memmap(path, mode="r")
    cur = _Cursor(raw, path)
    if bytes(raw[:4]) != _MAGIC:
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    cur.pos = 4
    version, tensor_count, kv_count = cur.take("<IQQ")
    if version not in _VERSIONS:
        raise ValueError(f"{path} is GGUF version {version}; versions {_VERSIONS} are read")
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key, value_type = cur.string(), cur.take("<I")
        if key == _ALIGNMENT_KEY and value_type == 4:  # uint32, as llama.cpp writes it
            alignment = cur.take("<I")
        else:
            cur.skip_value(value_type)
    infos = []
    for _ in range(tensor_count):
        name = cur.string()
        n_dims = cur.take("<I")
        dims = [cur.take("<Q") for _ in range(n_dims)]
        infos.append((name, dims, GGMLQuantizationType(cur.take("<I")), cur.take("<Q")))
    start = cur.pos + (-cur.pos % alignment)
    tensors = []
    for name, dims, qtype, offset in infos:
        rows = tuple(reversed(dims))  # numpy order: the row length last
        block, type_size = GGML_QUANT_SIZES[qtype]
        if qtype.name in _NUMERIC:
            dtype, shape = np.dtype(_NUMERIC[qtype.name]), rows
        else:
            dtype, shape = np.dtype(np.uint8), (*rows[:-1], rows[-1] // block * type_size)
        first = start + offset
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if first + nbytes > len(raw):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file")
        data = raw[first:first + nbytes].view(dtype).reshape(shape)
        tensors.append(GGUFTensor(name, qtype, np.array(dims, dtype=np.uint64), data))
    return tensors


def release(data: np.ndarray) -> None:
    """Drops the pages of a tensor's memory-mapped data from this process's resident set, once
    the loader has read them: the file's pages stay in the page cache (a later read maps them
    again), but a model loaded from a file no longer counts the file's pages in its RSS beside
    its own copy. Linux with glibc; elsewhere, or for data not mapped from a file, nothing."""
    if isinstance(data, np.memmap) and data.nbytes > 0:
        release_range(data.ctypes.data, data.nbytes)
