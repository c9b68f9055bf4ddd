"""OpenTelemetry spans around evaluations (the optional ``otel`` extra).

Without ``opentelemetry`` installed a runner has no tracer and pays nothing per item; with it, one
span per evaluation, ``trio_supervise.evaluate <spec>``, with the item's id, spec, queue, attempt
and lease version, and how the evaluation ended. An item enqueued while a span was current
carries that span's ``traceparent``: its evaluation's span is a child of it, so a web request
and the jobs it caused are one trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .._errors import ConfigError
from ..job import Settlement, WorkItem, first_line
from ._settings import RunnerSettings

__all__ = ["evaluation_span", "tracer_for"]


def tracer_for(settings: RunnerSettings) -> Any | None:
    """The tracer a run uses (``settings.tracing``): None without ``opentelemetry`` (unless it
    is required: :class:`ConfigError`, naming the extra), when tracing is off, or, by default,
    when no tracer provider is set as the run starts (nothing would record the spans, and a
    span held by every in-flight evaluation costs about 3 KB each: P11m)."""
    if settings.tracing is False:
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        if settings.tracing:
            raise ConfigError(
                "tracing is True, but opentelemetry is not installed: "
                "pip install 'trio_supervise[otel]'"
            ) from None
        return None
    if settings.tracing is None and isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    ):
        return None
    return trace.get_tracer("trio_supervise")


@contextlib.contextmanager
def evaluation_span(tracer: Any, item: WorkItem) -> Iterator[Any]:
    """A span (current while the driver runs) for one evaluation of *item*."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    attributes = {
        "trio_supervise.item_id": item.id,
        "trio_supervise.spec_id": item.spec_id,
        "trio_supervise.queue": item.queue,
        "trio_supervise.attempt": item.attempt,
        "trio_supervise.lease_version": item.lease_version,
    }
    parent = None if item.traceparent is None else _enqueuer(trace, item.traceparent)
    with tracer.start_as_current_span(
        f"trio_supervise.evaluate {item.spec_id}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def _enqueuer(trace: Any, traceparent: str) -> Any:
    """A context whose current span is the enqueuer's, remote, from its *traceparent* (checked
    when the item was enqueued: ``00-<trace id>-<span id>-<flags>``)."""
    _, trace_id, span_id, flags = traceparent.split("-")
    remote = trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16)),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))


def end_span(
    span: Any, settlement: Settlement | None, error: str | None, failure: Exception | None
) -> None:
    """Say on *span* how the evaluation ended: its outcome, or its error."""
    from opentelemetry.trace import Status, StatusCode

    if error is not None:
        span.set_attribute("trio_supervise.outcome", "error")
        if failure is not None:
            span.record_exception(failure)
        span.set_status(Status(StatusCode.ERROR, first_line(error)))
    elif settlement is not None:
        span.set_attribute("trio_supervise.outcome", str(settlement.kind))
        if settlement.error is not None:
            span.set_status(Status(StatusCode.ERROR, first_line(settlement.error)))
    else:
        span.set_attribute("trio_supervise.outcome", "stopped")
