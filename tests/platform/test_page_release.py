"""Handing a tensor's pages back while it is allocated (strand/platform/page_release.py)."""

from __future__ import annotations

import platform

import pytest
import torch

from strand.kernels import cpu_linear_panels
from strand.platform.page_release import release_pages

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="madvise on Linux")

MIB = 1 << 20


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_released_pages_leave_the_resident_set_and_read_as_zeros() -> None:
    t = torch.ones(16 * MIB // 4)
    before = _rss_kib()
    assert release_pages(t, 8 * MIB)
    assert before - _rss_kib() > 6 * 1024  # about 8 MiB back (page-aligned inside the tensor)
    assert float(t[-(7 * MIB // 4):].min()) == 1.0  # the rest untouched
    assert float(t[MIB // 4:7 * MIB // 4].abs().max()) == 0.0


def test_a_views_neighbours_keep_their_bytes() -> None:
    whole = torch.ones(4 * MIB // 4)
    view = whole[1000:-1000]  # starts and ends inside pages shared with its neighbours
    release_pages(view, view.numel() * 4)
    assert float(whole[:1000].min()) == 1.0 and float(whole[-1000:].min()) == 1.0
    assert float(view[2000:-2000].abs().max()) == 0.0


@pytest.mark.skipif(not cpu_linear_panels.chosen(), reason="no float32 panels on this CPU level")
@pytest.mark.parametrize("rows", [48 * 700 + 5, 16 * 3])
def test_packing_that_releases_its_source_makes_the_same_panels(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear_panels, "_RELEASE_EVERY", MIB)
    weight = torch.randn(rows, 256)
    expected = cpu_linear_panels.pack(weight)
    consumed = weight.clone()
    assert torch.equal(cpu_linear_panels.pack(consumed, release_source=True), expected)
    if rows * 256 * 4 > 2 * MIB:
        # its pages went as it was packed (all but a first page it may share)
        assert float(consumed[8:rows // 4].abs().max()) == 0.0


@pytest.mark.skipif(not cpu_linear_panels.chosen(), reason="no float32 panels on this CPU level")
def test_a_view_is_packed_without_releasing_its_storage() -> None:
    storage = torch.randn(48 * 800, 256)
    view = storage[:48 * 700]
    kept = storage.clone()
    cpu_linear_panels.pack(view, release_source=True)
    assert torch.equal(storage, kept)
