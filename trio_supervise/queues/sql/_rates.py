"""Rate limits on named queues over SQL (:class:`RateLimitStore`): setting one, reading them for
``list_queues``, and the rated claim, the one rule (``job/_rates.py``) applied under the
limit's lock. Each dialect says how it stores the log of starts and how a claim reaches
:meth:`SQLRates._claim_rated` (SQLite: under its write lock, from the statement that draws the
claim's lease version; PostgreSQL: ``lock_rate``, when ``claim_due`` says the queue is rated).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from ..._clock import WallClock
from ...job import (
    RateLimit,
    WorkItem,
    admitted,
    check_queue_name,
    check_rate,
    recorded,
    throttled_until,
)
from ._base import Lane, Row, SQLBase

__all__ = ["SQLRates"]


class SQLRates(SQLBase):
    """Rate limits: :meth:`set_rate_limit` and the rated claim."""

    # -- hooks -------------------------------------------------------------------------------

    def _starts_of(self, value: Any) -> list[dt.datetime]:
        """The stored log of starts as datetimes, oldest first."""
        raise NotImplementedError  # pragma: no cover

    def _starts_value(self, starts: Sequence[dt.datetime]) -> Any:
        """A log of starts as a statement parameter."""
        raise NotImplementedError  # pragma: no cover

    # -- the rated claim ---------------------------------------------------------------------

    @staticmethod
    def _rate(row: Row) -> RateLimit:
        return RateLimit(row["rate_limit"], row["period_us"] / 1_000_000)

    def _claim_rated(
        self,
        conn: Any,
        params: dict[str, Any],
        rate: RateLimit,
        starts: list[dt.datetime],
        now: dt.datetime,
        claim: Callable[[dict[str, Any]], list[WorkItem]],
    ) -> list[WorkItem]:
        """Claim (by *claim*, given ``claim_due``'s parameters) no more than *rate* lets start
        at *now* after *starts*, and record the starts; in the caller's transaction, which
        holds the limit's lock."""
        kept, at, free = admitted(starts, rate, now)
        if free <= 0:
            return []
        claimed = claim({**params, "limit": min(params["limit"], free), "now": self._time(at)})
        if claimed:
            log = recorded(kept, at, len(claimed), rate)
            self._record_starts(conn, params["queue"], rate, log)
        return claimed

    def _now_under_lock(self, now: Any) -> Any:
        """A rate-limited claim's "now" (a statement parameter), read again once the claim holds
        the lock of the limit or the keys: a claim that waited for the lock records its starts
        when it took them, not when it asked, so no window's starts are recorded earlier than
        they were (the items of a claim that waited 20 ms for SQLite's write lock, recorded
        at the time it asked, let the next window open 20 ms early). Only a wall clock is read
        again here (in the statement's thread): a test clock does not move while a claim waits,
        and PostgreSQL's own clock (*now* None) is read under the lock by the statement."""
        if now is None or not isinstance(self._clock, WallClock):
            return now
        return max(now, self._time(self._clock.now()))

    def _record_starts(
        self, conn: Any, queue: str, rate: RateLimit, log: Sequence[dt.datetime]
    ) -> None:
        self._write_log(conn, "record_starts", {"queue": queue}, rate, log)

    def _write_log(
        self,
        conn: Any,
        query: str,
        whose: dict[str, str],
        rate: RateLimit,
        log: Sequence[dt.datetime],
    ) -> None:
        """Write a window's log of starts (a queue's or a key's, *whose*) with the time it
        stays full until, if it is full."""
        conn.execute(self._queries[query], self._log_params(whose, rate, log))

    def _log_params(
        self, whose: dict[str, str], rate: RateLimit, log: Sequence[dt.datetime]
    ) -> dict[str, Any]:
        """The parameters that write a window's log (see :meth:`_write_log`)."""
        until = throttled_until(log, rate)
        return {
            **whose,
            "starts": self._starts_value(log),
            "throttled_until": None if until is None else self._time(until),
        }

    # -- the operator's side -----------------------------------------------------------------

    async def set_rate_limit(self, queue: str, rate: RateLimit | None) -> None:
        queue = check_queue_name(queue)
        rate = None if rate is None else check_rate(rate)
        queries = self._queries

        def run(conn: Any) -> None:
            with self._transaction(conn):
                if rate is None:
                    conn.execute(queries["clear_rate"], {"queue": queue})
                    self._notify(conn, [queue])  # its items may be claimable now
                    return
                row = conn.execute(queries["rate_of"], {"queue": queue}).fetchone()
                log = [] if row is None else self._starts_of(row["starts"])[-rate.limit :]
                until = throttled_until(log, rate)
                conn.execute(
                    queries["set_rate"],
                    {
                        "queue": queue,
                        "rate_limit": rate.limit,
                        "period_us": rate.period_us,
                        "starts": self._starts_value(log),
                        "throttled_until": None if until is None else self._time(until),
                    },
                )
                self._notify(conn, [queue])

        await self._run(run, lane=Lane.CALLER)
        self._changed()

    def _rates_read(self, rows: Sequence[Row]) -> dict[str, tuple[RateLimit, dt.datetime | None]]:
        """``queue_rates``' rows: per queue, its limit and, while its window is full now, when
        it lets a start in again."""
        now = self._clock_now()
        out: dict[str, tuple[RateLimit, dt.datetime | None]] = {}
        for row in rows:
            until = row["throttled_until"]
            until = None if until is None else self._from_time(until)
            out[row["queue"]] = (
                self._rate(row),
                until if until is not None and until > now else None,
            )
        return out
