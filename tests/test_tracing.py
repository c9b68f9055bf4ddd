"""OpenTelemetry spans around evaluations (the ``otel`` extra): one per evaluation, naming the
item and how it ended; none at all when tracing is off or opentelemetry is missing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.producer import Producer
from trio_supervise.queues import SQLiteQueue, WorkItem

from .test_runner import no_context, running

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

_EXPORTER = InMemorySpanExporter()
_PROVIDER = sdk.TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The spans the runner ends, exported in memory (one provider for the whole session)."""
    monkeypatch.setattr(trace, "get_tracer", _PROVIDER.get_tracer)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: _PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@attrs.define
class Driver:
    name: str = "traced"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        if item.config.get("fail"):
            raise RuntimeError("planned")
        return ts.Stop()


async def _run(settings: ts.RunnerSettings, *configs: dict[str, object]) -> None:
    queue = ts.MemoryQueue()
    for n, config in enumerate(configs):
        await queue.enqueue("job", item_id=f"i{n}", config=config, queue="default")
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    runner = ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=no_context
    )
    async with running(runner):
        await trio.sleep(1)


async def test_each_evaluation_is_one_span_naming_the_item_and_its_outcome(
    autojump_clock: trio.testing.MockClock, spans: InMemorySpanExporter
) -> None:
    """A span per evaluation, current while the driver runs, with the item's id, spec, queue
    and attempt, and its outcome; a failure is an error status with the exception recorded."""
    await _run(ts.RunnerSettings(worker_id="w"), {}, {"fail": True})
    ended = {span.attributes["trio_supervise.item_id"]: span for span in spans.get_finished_spans()}
    assert sorted(ended) == ["i0", "i1"]
    done, failed = ended["i0"], ended["i1"]
    assert done.name == "trio_supervise.evaluate job"
    assert done.kind is trace.SpanKind.CONSUMER
    assert dict(done.attributes) == {
        "trio_supervise.item_id": "i0",
        "trio_supervise.spec_id": "job",
        "trio_supervise.queue": "default",
        "trio_supervise.attempt": 1,
        "trio_supervise.lease_version": done.attributes["trio_supervise.lease_version"],
        "trio_supervise.outcome": "complete",
    }
    assert done.status.status_code is trace.StatusCode.UNSET
    assert failed.attributes["trio_supervise.outcome"] == "error"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert failed.status.description == "RuntimeError: planned"
    assert [event.name for event in failed.events] == ["exception"]


async def test_tracing_off_makes_no_span(
    autojump_clock: trio.testing.MockClock, spans: InMemorySpanExporter
) -> None:
    """``tracing=False``: no span, however opentelemetry is set up."""
    await _run(ts.RunnerSettings(worker_id="w", tracing=False), {})
    assert spans.get_finished_spans() == ()


async def test_without_a_tracer_provider_no_span_is_made_unless_required(
    autojump_clock: trio.testing.MockClock,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default a runner traces only when the application has set a tracer provider: with
    the API's own (proxy or no-op) provider nothing would record a span, and a span held by
    each in-flight evaluation costs memory (P11m). ``tracing=True`` makes them anyway."""
    for default in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        monkeypatch.setattr(trace, "get_tracer_provider", lambda default=default: default)
        await _run(ts.RunnerSettings(worker_id="w"), {})
        assert spans.get_finished_spans() == ()
        await _run(ts.RunnerSettings(worker_id="w", tracing=True), {})
        assert len(spans.get_finished_spans()) == 1
        spans.clear()


async def test_tracing_required_without_opentelemetry_is_refused(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tracing=True`` without the extra is refused at start, naming the extra."""
    import builtins

    real_import = builtins.__import__

    def no_otel(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_otel)
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    runner = ts.WorkflowRunner(
        queue=ts.MemoryQueue(),
        registry=registry,
        settings=ts.RunnerSettings(worker_id="w", tracing=True),
        build_context=no_context,
    )
    with pytest.raises(ts.ConfigError, match=r"pip install 'trio_supervise\[otel\]'"):
        await runner.run()


async def test_an_item_enqueued_in_a_span_continues_its_trace(
    autojump_clock: trio.testing.MockClock, spans: InMemorySpanExporter
) -> None:
    """Enqueued while a span is current (a web request's), an item carries its W3C
    traceparent, and its evaluation's span is that span's child: one trace. An item enqueued
    outside any span carries none, and its evaluation starts a trace of its own."""
    queue = ts.MemoryQueue()
    tracer = _PROVIDER.get_tracer("the web app")
    with tracer.start_as_current_span("POST /orders") as request:
        item = await queue.enqueue("job", item_id="caused")
    await queue.enqueue("job", item_id="alone")
    caller = request.get_span_context()
    flags = int(caller.trace_flags)
    assert item.traceparent == f"00-{caller.trace_id:032x}-{caller.span_id:016x}-{flags:02x}"
    assert (await queue.get("caused")).traceparent == item.traceparent
    assert (await queue.get("alone")).traceparent is None
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    runner = ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(worker_id="w"),
        build_context=no_context,
    )
    async with running(runner):
        await trio.sleep(1)
    ended = {
        span.attributes["trio_supervise.item_id"]: span
        for span in spans.get_finished_spans()
        if span.name.startswith("trio_supervise.")
    }
    caused, alone = ended["caused"], ended["alone"]
    assert caused.context.trace_id == caller.trace_id
    assert caused.parent is not None
    assert caused.parent.span_id == caller.span_id
    assert caused.parent.is_remote
    assert alone.parent is None
    assert alone.context.trace_id != caller.trace_id


async def test_batches_and_producers_carry_the_current_span(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """Every enqueue takes the current span's context: a batch, and a producer outside Trio
    on the application's connection; an explicit traceparent is kept as given."""
    queue = ts.MemoryQueue()
    given = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    tracer = _PROVIDER.get_tracer("the web app")
    path = tmp_path / "queue.db"
    async with await SQLiteQueue.connect(path):
        pass
    with tracer.start_as_current_span("POST /batch") as request:
        done = await queue.enqueue_many(
            [ts.NewItem(spec_id="job"), ts.NewItem(spec_id="job", traceparent=given)]
        )
        with sqlite3.connect(path) as conn:
            produced = Producer().enqueue(conn, "job")
    caller = request.get_span_context()
    flags = int(caller.trace_flags)
    expected = f"00-{caller.trace_id:032x}-{caller.span_id:016x}-{flags:02x}"
    assert [each.item.traceparent for each in done] == [expected, given]
    assert produced.traceparent == expected


def test_without_opentelemetry_in_use_nothing_is_imported_or_stored() -> None:
    """An enqueue in a process that never imported opentelemetry imports none of it and
    stores no trace context (the cost is one dictionary lookup a batch)."""
    code = (
        "import sys, trio, trio_supervise as ts\n"
        "async def main():\n"
        "    item = await ts.MemoryQueue().enqueue('job')\n"
        "    assert item.traceparent is None\n"
        "trio.run(main)\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
