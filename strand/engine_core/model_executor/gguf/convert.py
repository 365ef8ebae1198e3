"""One GGUF file -> one cached HF directory of its config and tokenizer; the weights stay in the
file (see the package docstring)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from strand import envs
from strand.engine_core.model_executor.gguf.config import hf_config
from strand.engine_core.model_executor.gguf.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)
_VERSION = "5"  # bump when the conversion changes: old caches are then made again
SOURCE_FILE = "gguf_source.json"  # in a converted directory: the .gguf file it was made from
# What the conversions before version 4 wrote beside the config: every tensor in float32.
_OLD_WEIGHTS = "model.safetensors"
_OLD_VERSIONS = ("2", "3", "4")


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix.lower() == ".gguf"


def cache_root() -> Path:
    return envs.cache_dir() / "gguf"


def _metadata(reader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.model",
                                                             "tokenizer.ggml.pre"):
            if len(f.data) != 1:  # the vocabulary arrays: read where needed
                continue
        try:
            out[key] = f.contents()
        except Exception:  # a field of a type this gguf version cannot decode: not one we read
            continue
    return out


def cached_dir(path: str | Path, version: str = _VERSION) -> Path:
    """Where the HF directory made from this GGUF file is cached (whether made yet or not), by
    this conversion's version or an earlier one's."""
    src = Path(path).resolve()
    stat = src.stat()
    key = hashlib.sha256(f"{version}|{src}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache_root() / f"{src.stem}-{key.hexdigest()[:12]}"


def source_of(directory: str | Path) -> Path | None:
    """The .gguf file a converted directory was made from, where it is still there unchanged
    (quantization='gguf' reads its blocks); None for any other directory."""
    record = Path(directory) / SOURCE_FILE
    if not record.is_file():
        return None
    source = json.loads(record.read_text(encoding="utf-8"))
    path = Path(source["path"])
    if not path.is_file():
        return None
    stat = path.stat()
    return path if (stat.st_size, stat.st_mtime_ns) == (source["size"], source["mtime_ns"]) else None


def weights_file(directory: str | Path) -> Path | None:
    """The .gguf file whose tensors a converted directory's model reads; None for a directory
    holding its own weights (FileNotFoundError where the file is gone or has changed)."""
    record = Path(directory) / SOURCE_FILE
    if not record.is_file() or (Path(directory) / _OLD_WEIGHTS).is_file():
        return None
    source = source_of(directory)
    if source is None:
        made_from = json.loads(record.read_text(encoding="utf-8"))["path"]
        raise FileNotFoundError(
            f"{str(directory)!r} holds no weights: they are read from {made_from!r}, which is "
            "gone or has changed since; load the .gguf file itself")
    return source


def gguf_to_hf_dir(path: str | Path) -> Path:
    """The HF directory made from this GGUF file (made now if it is not cached)."""
    src = Path(path).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    out = cached_dir(src)
    if (out / "config.json").is_file():
        return out
    try:
        import gguf
    except ImportError as exc:  # a dependency of the package: only a broken install lacks it
        raise ValueError("loading GGUF files needs the `gguf` package (pip install gguf)") from exc
    start = time.monotonic()
    logger.info("converting %s into %s (once)", src.name, out)
    reader = gguf.GGUFReader(str(src))
    metadata = _metadata(reader)
    tokenizer, tokenizer_config = build_tokenizer(reader, metadata)
    rope_freqs = next((np.array(t.data) for t in reader.tensors if t.name == "rope_freqs.weight"),
                      None)
    config = hf_config(metadata, {t.name for t in reader.tensors}, tokenizer.get_vocab_size(),
                       rope_freqs)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Made beside its final place and renamed into it: stages starting together never read a
    # half-written directory, and a second conversion racing this one just loses the rename.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        stat = src.stat()
        (tmp / SOURCE_FILE).write_text(json.dumps(
            {"path": str(src), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}),
            encoding="utf-8")
        _write(tmp, config, tokenizer, tokenizer_config)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1f s", src.name, time.monotonic() - start)
    _remove_old_copies(src, keep=out)
    return out


def _remove_old_copies(src: Path, keep: Path) -> None:
    """Deletes the float32 copies earlier versions made of this same file (their directories
    are keyed as this one's, by their own version): a 7B model's was 28 GB nothing reads now."""
    for version in _OLD_VERSIONS:
        other = cached_dir(src, version)
        if other == keep or not (other / _OLD_WEIGHTS).is_file():
            continue
        size = (other / _OLD_WEIGHTS).stat().st_size
        shutil.rmtree(other, ignore_errors=True)
        logger.info("removed %s, an older conversion's float32 copy of %s (%.1f GB)", other,
                    src.name, size / 1e9)


def _write(out: Path, config: dict[str, Any], tokenizer: Any,
           tokenizer_config: dict[str, Any]) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1),
                                               encoding="utf-8")
    # config.json last: its presence marks a complete directory.
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
