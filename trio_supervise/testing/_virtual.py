"""SQLite in virtual time: the database in the loop of a time-travel test.

:func:`open_virtual_sqlite` opens a :class:`~trio_supervise.queues.SQLiteQueue` whose "now"
follows Trio's clock (a :class:`TrioClock` reading the harness's epoch when it opens) and whose
statements run in Trio's own thread, so an autojump clock never jumps while one runs, and which
wakes a waiting runner at due times by Trio's clock and on its own writes (no polling for other
processes' commits). A month of a workflow then passes in well under a second, every step,
sleep and event written to the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import AsyncIterator
from typing import ClassVar

import attrs
import trio

from .._clock import TrioClock
from ..queues import SQLiteQueue
from ._harness import DEFAULT_EPOCH

__all__ = ["VirtualSQLiteQueue", "open_virtual_sqlite"]


@attrs.define(eq=False, kw_only=True)
class VirtualSQLiteQueue(SQLiteQueue):
    """A :class:`SQLiteQueue` running its statements in Trio's thread (for virtual time)."""

    _inline: ClassVar[bool] = True


@contextlib.asynccontextmanager
async def open_virtual_sqlite(
    path: str | os.PathLike[str], *, epoch: dt.datetime = DEFAULT_EPOCH
) -> AsyncIterator[SQLiteQueue]:
    """A fresh or existing SQLite queue at *path* for a test under Trio's autojump clock, its
    clock reading *epoch* now (as :func:`open_harness`'s memory queue); closed on the way out.
    """
    opened = dt.timedelta(seconds=trio.current_time())
    queue = await VirtualSQLiteQueue.connect(
        path, clock=TrioClock(epoch=epoch - opened), watch_interval=None
    )
    async with queue:
        yield queue
