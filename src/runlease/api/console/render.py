"""Templates (Jinja2, autoescaped: run input, labels and error messages are
hostile) and the headers every console page carries."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from runlease.api.console.summary import summary, took
from runlease.api.console.timeline import duration, seconds

PRETTY_MAX_CHARS = 20_000

# Scripts and styles from our own origin only: even an escaping mistake
# could not run an injected inline script.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(value: datetime | None) -> Markup:
    """A time in UTC; console.js shows it in the viewer's zone, UTC on hover."""
    if value is None:
        return Markup("&mdash;")
    utc = value.astimezone(UTC)
    iso = utc.isoformat()
    text = utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, text, text)


def pretty(value: Any, limit: int = PRETTY_MAX_CHARS) -> str:
    """JSON, indented, cut at limit characters (the API has all of it)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > limit:
        return f"{text[:limit]}\n... ({len(text) - limit} more characters: see the API)"
    return text


def short(value: object, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def span(start: datetime | None, end: datetime | None) -> str:
    """How long from start to end, as people read it ("—" without both)."""
    if start is None or end is None:
        return "—"
    return duration(seconds(start, end))


def status_name(value: Any) -> str:
    """A run's status as text: an enum's value, or the text itself (a status
    this console does not know yet still shows, and styles as a plain badge)."""
    return str(getattr(value, "value", value))


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat()


def _json_attr(value: Any) -> Markup:
    """A value for a data-* attribute, JSON then attribute-escaped."""
    return escape(json.dumps(value))


def make_env() -> Environment:
    env = Environment(loader=PackageLoader("runlease.api.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=when, pretty=pretty, short=short, json_attr=_json_attr,
                       duration=duration, span=span, iso=iso, summary=summary, took=took,
                       status_name=status_name)
    return env


class Renderer:
    def __init__(self) -> None:
        self.env = make_env()

    def page(self, request: Request, name: str, context: dict[str, Any],
             status: int = 200) -> HTMLResponse:
        html = self.env.get_template(name).render(request=request, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
