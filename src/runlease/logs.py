"""Logging set-up: stable event names first, `key=value` after; JSON on request.

Every line passes the redactor (message, exception and stack text): a log
line quotes errors, URLs and tool output as freely as a stored error does,
and logs are shipped and kept where run data is not.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from runlease import tracing
from runlease.core.redact import DEFAULT_REDACTOR, Redactor

_redactor: Redactor = DEFAULT_REDACTOR


def use_redactor(redactor: Redactor) -> None:
    """Redact log lines with this redactor from now on (say, once settings
    with extra `redact_patterns` are loaded)."""
    global _redactor
    _redactor = redactor


def redact(text: str) -> str:
    """Text as a log line would show it (what else leaves the process the
    same way, a span's attribute say, passes this too)."""
    return _redactor.text(text)


class RedactingFormatter(logging.Formatter):
    """The standard line, redacted as a whole (exception and stack included);
    while tracing is on, a line written inside a span ends with its
    `trace_id=... span_id=...` (tracing.py)."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = tracing.log_ids()
        if ids is not None:
            first, newline, rest = line.partition("\n")
            line = f"{first} trace_id={ids[0]} span_id={ids[1]}{newline}{rest}"
        return _redactor.text(line)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = _redactor.text(record.getMessage())
        event, _, rest = message.partition(" ")
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event,
        }
        for part in rest.split():
            key, sep, value = part.partition("=")
            if sep:
                out[key] = value
        ids = tracing.log_ids()
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        out["message"] = message
        if record.exc_info:
            out["exception"] = _redactor.text(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = _redactor.text(self.formatStack(record.stack_info))
        return json.dumps(out, default=str)


def configure(level: str = "INFO", *, json_lines: bool = False,
              redactor: Redactor | None = None) -> None:
    if redactor is not None:
        use_redactor(redactor)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else RedactingFormatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg's connection pool logs every reconnect attempt at WARNING; ours say it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # One line per HTTP request made by the client is noise at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
