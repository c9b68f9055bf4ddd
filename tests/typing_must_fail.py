"""Drivers that ``mypy --strict`` must refuse; ``tests/test_typing.py`` checks that each line
marked ``# E: <code>`` has exactly that error, and no other line has any. Never run."""

from __future__ import annotations

import attrs

import trio_supervise as ts
from trio_supervise.queues import WorkItem


@attrs.frozen
class Watering:
    litres: float


@attrs.frozen
class Digest:
    recipient: str


class MislabelledDriver:
    """Declares ``Watering`` but annotates the config as ``Digest``."""

    name = "mislabelled"
    spec_ids = ("watering",)
    config_type = Watering

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem, config: Digest) -> ts.Outcome:
        return ts.Stop()


class MislabelledSubclass(ts.TypedWorkflowDriver[None, Watering]):
    """The same mistake in a subclass of the protocol: reported at the class."""

    name = "subclass"
    spec_ids = ("watering",)
    config_type = Digest  # E: assignment

    async def evaluate(
        self,
        context: None,
        item: WorkItem,
        config: Digest,  # E: override
    ) -> ts.Outcome:
        return ts.Stop()


class WateringDriver(ts.TypedWorkflowDriver[None, Watering]):
    name = "watering"
    spec_ids = ("watering",)
    config_type = Watering

    async def evaluate(self, context: None, item: WorkItem, config: Watering) -> ts.Outcome:
        return ts.Stop() if config.recipient else ts.Continue()  # E: attr-defined


registry: ts.DriverRegistry[None] = ts.DriverRegistry()
registry.register(MislabelledDriver())  # E: misc
registry.register(WateringDriver())
garden_registry: ts.DriverRegistry[str] = ts.DriverRegistry()
garden_registry.register(WateringDriver())  # E: arg-type
