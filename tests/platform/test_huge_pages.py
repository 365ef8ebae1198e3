"""`import strand.engine_core` asks torch for transparent huge pages before its first allocation, unless
the user chose or the kernel has them off (huge_pages.py says why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strand.platform.huge_pages import ENV, configure_huge_pages, thp_mode

# A 64 MB tensor allocated after `import strand.engine_core`: the process's AnonHugePages (kB).
PROBE = ("import os, strand.engine_core, torch; t = torch.ones(16 << 20); "
         "rollup = open('/proc/self/smaps_rollup').read(); "
         "huge = int(rollup.split('AnonHugePages:')[1].split()[0]); "
         "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), huge)")


def _probe(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, check=True,
                         capture_output=True, text=True, timeout=120)
    value, huge = out.stdout.split()
    return value, int(huge)


needs_thp = pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists() or thp_mode() in (None, "never"),
    reason="transparent huge pages are off or unreadable here")


@needs_thp
def test_a_large_tensor_lies_on_huge_pages() -> None:
    value, huge = _probe()
    assert value == "1"
    assert huge >= 32 * 1024  # most of the 64 MB (a 2 MB page at either end may be small)


@needs_thp
def test_a_users_choice_is_kept() -> None:
    value, huge = _probe(**{ENV: "0"})
    if thp_mode() == "madvise":  # "always" gives huge pages to everything anyway
        assert (value, huge) == ("0", 0)
    else:
        assert value == "0"


def test_the_mode_is_read_from_the_brackets(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert thp_mode(mode) == "madvise"
    assert thp_mode(tmp_path / "missing") is None
    monkeypatch.delenv(ENV, raising=False)
    mode.write_text("always madvise [never]\n")
    assert not configure_huge_pages(mode) and ENV not in os.environ
    mode.write_text("[always] madvise never\n")
    assert configure_huge_pages(mode) == (sys.platform == "linux")
