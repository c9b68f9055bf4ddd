"""Rate limits per concurrency key over SQL (:class:`KeyRateLimitStore`): setting one, and what
a claim of keyed rows may take, the rule of ``job/_key_rates.py`` applied under the claim's lock
(SQLite: its write lock; PostgreSQL: the keys' advisory locks, see ``claim_keys``).

A claim asks only when a rule exists (a probe in a statement it makes anyway): it reads the
rules and the logs of the keys it may claim (:meth:`SQLKeyRates._key_caps`), claims no more of
each key than its window lets start (the statement's ``key_caps``), and writes the logs of the
keys it started (:meth:`SQLKeyRates._record_key_starts`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ...job import (
    RateLimit,
    WorkItem,
    check_key_rule,
    check_prune_limit,
    check_rate,
    key_caps,
    key_logs_after,
    rule_for,
)
from ._base import Lane
from ._rates import SQLRates

__all__ = ["KeyCaps", "SQLKeyRates"]

KeyCaps = dict[str, tuple[RateLimit, list[dt.datetime], dt.datetime, int]]
"""Per key a rule holds: its rate, the starts in its window, when to record, how many may start."""


class SQLKeyRates(SQLRates):
    """Rate limits per concurrency key: :meth:`set_key_rate_limit` and the claim's side."""

    # -- the claim's side --------------------------------------------------------------------

    def _key_caps(
        self, conn: Any, keys: Sequence[str], params: dict[str, Any]
    ) -> tuple[KeyCaps, Any]:
        """What each of *keys* may start now, from the rules and the keys' logs, and the time
        they were judged by (the claim's "now"; PostgreSQL: the database's clock read under
        the keys' locks, which the claim then uses); in the claim's transaction."""
        if not keys:
            return {}, params["now"]
        rows = conn.execute(
            self._queries["key_rates_of"], {"keys": self._ids(list(keys)), "now": params["now"]}
        ).fetchall()
        if not rows:
            return {}, params["now"]
        rules = {
            row["key"]: RateLimit(row["rate_limit"], row["period_us"] / 1_000_000)
            for row in rows
            if row["rate_limit"] is not None
        }
        logs = {row["key"]: self._starts_of(row["starts"]) for row in rows}
        now = rows[0]["now"]
        return key_caps(keys, rules, logs, self._from_time(now)), now

    @staticmethod
    def _caps_value(caps: KeyCaps) -> dict[str, int]:
        return {key: cap[3] for key, cap in caps.items()}

    def _record_key_starts(self, conn: Any, caps: KeyCaps, claimed: Sequence[WorkItem]) -> None:
        """Write the logs of the keys *claimed* started (a key a rule holds): one batch, as a
        claim of many tenants starts many keys (a statement each cost a round trip each on
        PostgreSQL; psycopg sends a batch in one pipeline)."""
        logs = key_logs_after(caps, claimed)
        if logs:
            conn.cursor().executemany(
                self._queries["record_key_starts"],
                [self._log_params({"key": key}, caps[key][0], log) for key, log in logs.items()],
            )

    def _write_key_log(
        self, conn: Any, key: str, rate: RateLimit, log: Sequence[dt.datetime]
    ) -> None:
        self._write_log(conn, "record_key_starts", {"key": key}, rate, log)

    # -- the operator's side -----------------------------------------------------------------

    async def set_key_rate_limit(self, key: str, rate: RateLimit | None) -> None:
        key = check_key_rule(key)
        rate = None if rate is None else check_rate(rate)
        queries = self._queries

        def run(conn: Any) -> None:
            with self._transaction(conn):
                if rate is None:
                    conn.execute(queries["clear_key_rate"], {"key": key})
                else:
                    conn.execute(
                        queries["set_key_rate"],
                        {"key": key, "rate_limit": rate.limit, "period_us": rate.period_us},
                    )
                # Each key's log is judged by the rule that holds it now (the starts recorded
                # so far count against a changed limit); a key no rule holds forgets them.
                rows = conn.execute(queries["lock_key_rates"]).fetchall()
                rules = {
                    row["key"]: self._rate(row) for row in rows if row["rate_limit"] is not None
                }
                names = sorted(rules)
                for row in rows:
                    rule = rule_for(row["key"], names)
                    if rule is None:
                        conn.execute(queries["forget_key"], {"key": row["key"]})
                    else:
                        log = self._starts_of(row["starts"])[-rules[rule].limit :]
                        self._write_key_log(conn, row["key"], rules[rule], log)
                self._notify(conn, [key])  # keyed items may be claimable now

        await self._run(run, lane=Lane.CALLER)
        self._changed()

    async def prune_key_logs(self, *, limit: int | None = None) -> int:
        limit = check_prune_limit(limit)
        params = {"now": self._now(), "limit": self._no_limit if limit is None else limit}
        query = self._queries["prune_key_logs"]

        def delete(conn: Any) -> int:
            with self._write(conn):  # one short transaction per batch
                return int(conn.execute(query, params).rowcount)

        return await self._run(delete, lane=Lane.CALLER)

    async def key_rate_limits(self) -> dict[str, RateLimit]:
        rows = await self._run(
            lambda conn: conn.execute(self._queries["all_key_rates"]).fetchall(),
            lane=Lane.CALLER,
        )
        return {row["key"]: self._rate(row) for row in rows if row["rate_limit"] is not None}

    async def throttled_keys(self) -> dict[str, dt.datetime]:
        now = self._clock_now()
        rows = await self._run(
            lambda conn: conn.execute(self._queries["all_key_rates"]).fetchall(),
            lane=Lane.CALLER,
        )
        out = {}
        for row in rows:
            until = row["throttled_until"]
            until = None if until is None else self._from_time(until)
            if until is not None and until > now:
                out[row["key"]] = until
        return out
