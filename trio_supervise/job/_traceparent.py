"""Trace context carried by items: the W3C ``traceparent`` of the span current at the
enqueue (with the ``otel`` extra), checked, so that the evaluation continues the trace of the
request that caused it. Without ``opentelemetry`` in use, reading it costs one dictionary
lookup per batch and nothing is stored."""

from __future__ import annotations

import re
import sys

__all__ = ["check_traceparent", "current_traceparent"]

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_RULE = "a W3C traceparent, '00-' then 32 and 16 lowercase hex digits and 2 of flags"


def check_traceparent(value: object) -> str | None:
    """*value* if it is None or a valid ``traceparent`` (``ValueError`` naming the field)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"traceparent must be {_RULE}, got a {type(value).__name__}")
    found = _TRACEPARENT.fullmatch(value)
    if found is None or found[1] == "ff" or found[2] == "0" * 32 or found[3] == "0" * 16:
        raise ValueError(f"traceparent must be {_RULE}, got {value[:80]!r}")
    return value


def current_traceparent() -> str | None:
    """The ``traceparent`` of the span current here, or None: none is, or ``opentelemetry``
    was never imported (then no span can be current, and nothing is imported here)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
