"""Logging set-up: stable event names first, `key=value` after; JSON on request."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
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
        out["message"] = message
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO", *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg's pool logs every reconnect attempt at WARNING; ours say it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # One line per HTTP request made by the client is noise at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
