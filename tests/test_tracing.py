"""OpenTelemetry spans around evaluations (the ``otel`` extra): one per evaluation, naming the
item and how it ended; none at all when tracing is off or opentelemetry is missing."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import WorkItem

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
