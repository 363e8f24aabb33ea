"""Log lines pass the redactor: message, its arguments, exception and stack."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from runlease import logs
from runlease.core.redact import DEFAULT_REDACTOR, MASK, Redactor

URL = "postgresql://app:s3cr3t-pw/x@db:5432/runs"


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.use_redactor(DEFAULT_REDACTOR)


def _log_secrets() -> None:
    log = logging.getLogger("runlease.test")
    log.warning("db_unreachable url=%s", URL)
    try:
        raise ValueError("refused Authorization: Bearer abcdefgh12345678")
    except ValueError:
        log.exception("run_failed cookie=%s", "sid=zz99yy88")


@pytest.mark.usefixtures("root")
def test_plain_log_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO")
    _log_secrets()
    err = capsys.readouterr().err
    assert "db_unreachable url=postgresql://app:" + MASK + "@db:5432/runs" in err
    assert "ValueError: refused Authorization: " + MASK in err
    for secret in ("s3cr3t", "abcdefgh1234", "zz99yy88"):
        assert secret not in err


@pytest.mark.usefixtures("root")
def test_json_log_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", json_lines=True)
    _log_secrets()
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["event"] == "db_unreachable"
    assert first["url"] == f"postgresql://app:{MASK}@db:5432/runs"
    assert second["cookie"] == MASK
    assert "ValueError: refused Authorization: " + MASK in second["exception"]
    for secret in ("s3cr3t", "abcdefgh1234", "zz99yy88"):
        assert secret not in json.dumps([first, second])


@pytest.mark.usefixtures("root")
def test_configured_patterns_apply_to_logs(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", redactor=Redactor([r"ACME-\d{6}"]))
    logging.getLogger("runlease.test").info("tool_output id=ACME-123456")
    assert f"tool_output id={MASK}" in capsys.readouterr().err
