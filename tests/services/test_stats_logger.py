"""The periodic stats line: rates over the interval, only while there is activity."""

from __future__ import annotations

import pytest

from strand.engine_core.stats_logger import StatsLogger

IDLE = {"num_running_reqs": 0.0, "num_waiting_reqs": 0.0, "kv_cache_usage": 0.0,
        "prefix_cache_hit_rate": 0.0}
BUSY = {"num_running_reqs": 3.0, "num_waiting_reqs": 1.0, "kv_cache_usage": 0.25,
        "prefix_cache_hit_rate": 0.5}


def test_rates_over_the_interval_then_one_idle_line_then_silence(
        caplog: pytest.LogCaptureFixture) -> None:
    stats = StatsLogger(interval_s=5.0)
    start = stats._last_log
    with caplog.at_level("INFO", logger="strand.stats"):
        assert stats.log_if_due(IDLE, start + 5.0) is None  # nothing happened: nothing said
        stats.count(prompt_tokens=100, generation_tokens=20)
        assert stats.log_if_due(BUSY, start + 7.0) is None  # not due yet
        line = stats.log_if_due(BUSY, start + 10.0)
        assert line == ("Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: "
                        "4.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 25.0%, "
                        "Prefix cache hit rate: 50.0%")
        idle = stats.log_if_due(IDLE, start + 15.0)
        assert idle is not None and idle.startswith("Avg prompt throughput: 0.0 tokens/s, "
                                                    "Avg generation throughput: 0.0 tokens/s")
        assert stats.log_if_due(IDLE, start + 20.0) is None
    assert [r.getMessage() for r in caplog.records] == [line, idle]
