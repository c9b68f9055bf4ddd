"""Graceful shutdown as a value every part of a service can watch and trigger."""

from __future__ import annotations

import attrs
import trio
import trio_util

__all__ = ["Shutdown"]


@attrs.define(eq=False)
class Shutdown:
    """A one-way switch: once begun, shutdown stays begun.

    Workers watch it to finish their current work and return; a supervisor triggers it when a
    worker fails terminally; a signal handler triggers it on SIGTERM. A child ``Shutdown`` (see
    :meth:`child`) begins whenever its parent does, and can also begin on its own (a nested
    supervisor shutting down only its subtree).
    """

    _requested: trio_util.AsyncBool = attrs.field(
        init=False,
        factory=lambda: trio_util.AsyncBool(False),  # type: ignore[no-untyped-call]
    )
    _reason: str | None = attrs.field(init=False, default=None)
    _children: list[Shutdown] = attrs.field(init=False, factory=list)

    @property
    def requested(self) -> bool:
        """Whether shutdown has begun."""
        return bool(self._requested.value)

    @property
    def reason(self) -> str | None:
        """Why shutdown began (the first reason given), or None while it has not."""
        return self._reason

    @property
    def flag(self) -> trio_util.AsyncBool:
        """The underlying :class:`trio_util.AsyncBool`, for ``move_on_when`` and friends."""
        return self._requested

    def begin(self, reason: str = "requested") -> None:
        """Begin shutdown (idempotent: the first reason sticks) and propagate to children."""
        if self._requested.value:
            return
        self._reason = reason
        self._requested.value = True
        for child in self._children:
            child.begin(reason)

    async def wait(self) -> None:
        """Return once shutdown has begun (at once if it already has)."""
        await self._requested.wait_value(True)

    def child(self) -> Shutdown:
        """A shutdown that begins with this one, and may also begin alone."""
        child = Shutdown()
        self.adopt(child)
        return child

    def adopt(self, child: Shutdown) -> None:
        """Make an existing *child* begin whenever this one does (idempotent).

        A nested supervisor is built before its parent, with a shutdown of its own; the parent
        adopts it. Adopting a shutdown that would begin this one in turn is refused.
        """
        if child is self or self._reaches(child=self, start=child):
            raise ValueError("adopting this shutdown would make a cycle")
        if child not in self._children:
            self._children.append(child)
        if self.requested:
            child.begin(self._reason or "requested")

    @staticmethod
    def _reaches(*, child: Shutdown, start: Shutdown) -> bool:
        stack = [start]
        while stack:
            node = stack.pop()
            if node is child:
                return True
            stack.extend(node._children)
        return False

    def detach(self, child: Shutdown) -> None:
        """Stop propagating to *child* (when the child's owner is gone)."""
        if child in self._children:
            self._children.remove(child)

    async def sleep(self, seconds: float) -> bool:
        """Sleep up to *seconds*; return True if shutdown began first (the wait ends early)."""
        with trio.move_on_after(seconds):
            await self.wait()
            return True
        return False
