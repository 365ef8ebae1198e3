"""An OTLP endpoint with nothing listening is reported once, then retried quietly."""

from __future__ import annotations

import logging

import pytest

from strand.services.common.tracing import quiet_export_failures

EXPORTER = "opentelemetry.exporter.otlp.proto.grpc.exporter"


def _transient(logger: logging.Logger) -> None:
    # The exporter's own message (opentelemetry-exporter-otlp-proto-grpc, every retry).
    logger.warning("Transient error %s encountered while exporting %s to %s, retrying in "
                   "%.2fs. Error details: %s", "StatusCode.UNAVAILABLE", "traces",
                   "localhost:4317", 1.0, "failed to connect")


def test_export_failures_are_logged_once_until_an_export_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    import opentelemetry.exporter.otlp.proto.grpc.exporter  # noqa: F401 - its logger, as in use

    quiet = quiet_export_failures()
    quiet.reset()
    logger = logging.getLogger(EXPORTER)
    with caplog.at_level(logging.INFO, logger=EXPORTER):
        for _ in range(3):
            _transient(logger)
        logger.error("Failed to export %s to %s, error code: %s", "traces", "localhost:4317",
                     "UNAVAILABLE")
        logger.warning("Exporter already shutdown, ignoring call")  # not an export failure
        quiet.reset()  # an export succeeded: the next outage is reported again
        _transient(logger)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert messages[0].startswith("Transient error StatusCode.UNAVAILABLE")
    assert messages[0].endswith("(retrying quietly; the next failures are not logged)")
    assert messages[1] == "Exporter already shutdown, ignoring call"
    assert messages[2].startswith("Transient error")
    quiet.reset()
