"""OpenTelemetry traces of a run, off unless the standard OTEL_* variables ask.

Off (the default), nothing of OpenTelemetry is imported and every helper
here returns at once: callers on hot paths test `ENABLED` (a module bool)
before making anything, so the worker's per-run path costs one attribute
read. `setup()` turns tracing on when the environment names an exporter:

    OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set,
    or OTEL_TRACES_EXPORTER=otlp|console; never with OTEL_SDK_DISABLED=true
    or OTEL_TRACES_EXPORTER=none.

It needs the `otel` extra (`pip install 'runlease[otel]'`: the SDK and the
OTLP/HTTP exporter); without it a start that asks for traces says so once
and runs untraced. Everything else (endpoint, headers, timeouts, sampler,
batch sizes, resource attributes, OTEL_SERVICE_NAME) is the SDK's own
reading of the OTEL_* variables.

The spans of one run (docs/operations.md draws the tree):

    submit        the API's POST /v1/runs; child of the request's `traceparent`
    queue.wait    per attempt: from when the run was available to its claim
    attempt       per attempt: claim to outcome (attempt, lease epoch, worker)
    model.turn    one model call of the built-in OpenAI-compatible agent
    tool          one tool process (command name, exit code, duration);
                  the tool gets TRACEPARENT naming this span
    wait.input    a wait for a person: asked to answered (api/humans.py)
    message       a message: sent to taken by the agent (worker/humans.py)

The run keeps the trace context it was submitted with (agent_runs.traceparent:
the submit span's, else the caller's header, validated), so every attempt, on
whichever worker, joins the same trace. `record_run_span` is the hook for
spans of a run outside an attempt (`wait.input`, `message`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

# True once setup() installed a tracer provider: read by hot paths.
ENABLED = False
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
# The opentelemetry.trace module and the W3C propagator, once setup() imported them.
_otel: Any = None
_propagator: Any = None

# W3C trace context, version 00: exactly 55 characters. A header longer
# than this bound is not looked at (hostile input costs no regex work).
TRACEPARENT_MAX_CHARS = 512
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
EXPORTERS = ("otlp", "console")


def parse_traceparent(value: str | None) -> str | None:
    """The traceparent header as stored (version 00, lower case), or None
    when it is absent or malformed: a bad header is ignored, never refused
    (W3C trace context: a receiver restarts the trace)."""
    if value is None or len(value) > TRACEPARENT_MAX_CHARS:
        return None
    value = value.strip().lower()
    # A future version may append fields after the 55 characters of 00.
    head, rest = value[:55], value[55:]
    match = _TRACEPARENT.fullmatch(head)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if (version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-"))
            or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN):
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
                 if e.strip()}
    if "none" in exporters:
        return False
    return bool(exporters & set(EXPORTERS) or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup(service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's tracer provider when the environment asks for
    traces; returns whether tracing is on. Idempotent."""
    global ENABLED, _tracer, _provider, _otel, _propagator
    environ = os.environ if environ is None else environ
    if ENABLED or not wanted(environ):
        return ENABLED
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("tracing_unavailable: OTEL_* variables ask for traces, but the "
                    "OpenTelemetry SDK is not installed (pip install 'runlease[otel]')")
        return False
    names = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    exporters: list[SpanExporter] = []
    if "otlp" in names:
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                               environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
        if protocol != "http/protobuf":
            log.warning("tracing_protocol_unsupported protocol=%s: runlease exports OTLP "
                        "over http/protobuf", protocol)
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("tracing_unavailable: the OTLP exporter is not installed "
                        "(pip install 'runlease[otel]')")
            return False
        exporters.append(OTLPSpanExporter())
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from runlease import __version__
    _otel, _propagator = trace, TraceContextTextMapPropagator()
    _provider, _tracer = provider, provider.get_tracer("runlease", __version__)
    ENABLED = True
    log.info("tracing_enabled service=%s exporters=%s",
             resource.attributes.get(SERVICE_NAME), ",".join(sorted(names & set(EXPORTERS))))
    return True


def shutdown() -> None:
    """Export what is left and stop (at the process's end)."""
    if _provider is not None:
        _provider.shutdown()


def tracer() -> Tracer:
    assert _tracer is not None, "tracing.setup() did not enable tracing"
    return _tracer


def context_of(traceparent: str | None) -> Context | None:
    """The OpenTelemetry context whose parent is this stored traceparent."""
    if traceparent is None or _propagator is None:
        return None
    context: Context = _propagator.extract({"traceparent": traceparent})
    return context


def traceparent_of(span: Span) -> str:
    """The traceparent that names this span (what tools and the store get)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1e9)


def record_run_span(name: str, traceparent: str | None, start: datetime, end: datetime,
                    attributes: Mapping[str, Any] | None = None) -> None:
    """A finished span of a run outside any attempt, timed by the database's
    clock, in the run's trace (child of its stored traceparent).

    The hook for the spans of a run timed by the database: `queue.wait`
    (available to claimed, worker/attempt_trace.py), `message` (sent at
    `start`, taken by the attempt at `end`: worker/humans.py passes
    current_traceparent(), the attempt's, as the parent), and `wait.input`
    (the run went waiting at `start`, its answer or timeout came at `end`),
    which whoever ends the wait can record with the run's stored
    traceparent. A no-op while tracing is off."""
    if not ENABLED:
        return
    span = tracer().start_span(name, context=context_of(traceparent),
                               attributes=dict(attributes or {}), start_time=_ns(start))
    span.end(end_time=max(_ns(end), _ns(start)))


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A span, child of the current one (within an attempt: the attempt's),
    current while the block runs; yields None (and costs nothing) when
    tracing is off. An exception escaping the block is recorded on it."""
    if not ENABLED:
        yield None
        return
    with tracer().start_as_current_span(name, attributes=dict(attributes or {})) as current:
        yield current


def start_span(name: str, traceparent: str | None, attributes: Mapping[str, Any]) -> Span:
    """A span, child of the stored traceparent (a new trace without one),
    made current in the calling task's context until that task ends: for an
    attempt, whose spans are children of it. Only while tracing is on."""
    started = tracer().start_span(name, context=context_of(traceparent),
                                  attributes=dict(attributes))
    from opentelemetry import context as otel_context
    otel_context.attach(_otel.set_span_in_context(started))
    return started


def end_span(started: Span, attributes: Mapping[str, Any], *, error: str | None = None) -> None:
    """Set the attributes, mark an error (its description), and end it."""
    started.set_attributes(dict(attributes))
    if error is not None:
        started.set_status(_otel.Status(_otel.StatusCode.ERROR, error))
    started.end()


def error_status(description: str) -> Any:
    """An ERROR status for span.set_status (tracing on only)."""
    return _otel.Status(_otel.StatusCode.ERROR, description)


def current_traceparent() -> str | None:
    """The traceparent of the current span, if tracing is on and one is current."""
    if not ENABLED:
        return None
    current = _otel.get_current_span()
    if not current.get_span_context().is_valid:
        return None
    return traceparent_of(current)


class _Stored:
    """What a submit stores when the API itself does not trace: the
    caller's traceparent, validated. A context manager like the span."""

    __slots__ = ("traceparent",)

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent

    def __enter__(self) -> _Stored:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _SubmitSpan(_Stored):
    __slots__ = ("_cm", "span")

    def __init__(self, header: str | None) -> None:
        scope = tracer().start_as_current_span("submit", context=context_of(header),
                                               kind=_server_kind())
        self._cm = scope
        self.span = scope.__enter__()
        super().__init__(traceparent_of(self.span))

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def _server_kind() -> Any:
    return _otel.SpanKind.SERVER


def submit_span(header: str | None) -> _Stored:
    """`with submit_span(request's traceparent) as s:` enqueue with
    s.traceparent: the submit span's context when the API traces, else the
    caller's header (validated; a malformed one is dropped)."""
    header = parse_traceparent(header)
    if not ENABLED:
        return _Stored(header)
    return _SubmitSpan(header)


def submitted(submit: _Stored, run_id: object, *, inserted: bool) -> None:
    """Name the run on the submit span (when the API traces)."""
    if isinstance(submit, _SubmitSpan):
        submit.span.set_attribute("runlease.run_id", str(run_id))
        submit.span.set_attribute("runlease.inserted", inserted)


def refused(submit: _Stored, error: BaseException) -> None:
    """Mark the submit span failed (when the API traces): its error's type only."""
    if isinstance(submit, _SubmitSpan):
        submit.span.set_status(error_status(type(error).__name__))


def log_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span for log lines, if any."""
    if not ENABLED:
        return None
    ctx = _otel.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
