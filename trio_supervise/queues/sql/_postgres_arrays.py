"""A batch's values as PostgreSQL arrays, for the statements that ``unnest`` them.

A settlement batch is one ``UPDATE ... FROM unnest(...)``: each column is read out of the batch
by one C loop (``map``), and the columns every entry fills go as array literals built by one
join each (:func:`text_array`, :func:`int_array`) instead of psycopg's list dumpers, which walk
a list in Python (about 0.3 us a value). A column of NULLs goes as NULL (:func:`nulls_none`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ...job import MAX_ERRORS
from ._settle import PLAIN_VALUES, SettleEntry

__all__ = ["int_array", "nulls_none", "settle_params", "text_array"]

_SETTLEMENT = operator.itemgetter(1)
_VALUES = operator.itemgetter(2)
_ITEM_ID = operator.attrgetter("item_id")
_LEASE_VERSION = operator.attrgetter("lease_version")
_KIND = operator.attrgetter("kind")
_ERROR = operator.attrgetter("error")
_AT = operator.itemgetter("at")
_CONFIG = operator.itemgetter("config")
_RESULT = operator.itemgetter("result")
_DELAY_US = operator.itemgetter("delay_us")


def settle_params(entries: Sequence[SettleEntry], now: Any) -> dict[str, Any]:
    # Each column is read out by one C loop (map), and the four every entry fills go as
    # array literals built by one join each (see text_array, int_array): psycopg's list
    # dumpers walk a list in Python, about 0.3 us a value. A column of NULLs (most
    # batches: no reschedule time, config, error or result) goes as NULL, which unnest
    # pads like an empty array: nothing to dump (see the query).
    sent = list(map(_SETTLEMENT, entries))
    values = list(map(_VALUES, entries))
    delays_us: str | list[int]
    ats: list[Any] | None
    configs: list[Any] | None
    results: list[Any] | None
    if values.count(PLAIN_VALUES) == len(values):
        ats = configs = results = None
        delays_us = "{" + ",".join(["0"] * len(values)) + "}"
    else:
        ats = nulls_none(list(map(_AT, values)))
        configs = nulls_none(list(map(_CONFIG, values)))
        results = nulls_none(list(map(_RESULT, values)))
        delays_us = int_array(list(map(_DELAY_US, values)))
    return {
        "ids": text_array(list(map(_ITEM_ID, sent))),
        "versions": int_array(list(map(_LEASE_VERSION, sent))),
        "kinds": text_array(list(map(_KIND, sent))),
        "delays_us": delays_us,
        "ats": ats,
        "configs": configs,
        "errors": nulls_none(list(map(_ERROR, sent))),
        "results": results,
        "now": now,
        "max_errors": MAX_ERRORS,
    }


def nulls_none(values: list[Any]) -> list[Any] | None:
    """*values*, or None if every one is None (``unnest`` pads a NULL array with NULLs, as an
    empty one)."""
    return values if values.count(None) != len(values) else None


def text_array(values: list[str]) -> str | list[str]:
    """*values* as a PostgreSQL array literal, for a ``%s::text[]`` parameter: every value in
    double quotes, so only a quote or a backslash needs escaping, and those are rare (item
    ids): one join, and a count that finds them. A value that is not text is left to psycopg
    (the list itself), which refuses it as it always has."""
    if not values:
        return "{}"
    try:
        joined = '","'.join(values)
    except TypeError:
        return values
    if joined.count('"') != 2 * (len(values) - 1) or "\\" in joined:
        joined = '","'.join(value.replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return '{"' + joined + '"}'


def int_array(values: list[int]) -> str | list[int]:
    """*values* as a PostgreSQL array literal, for a ``%s::bigint[]`` parameter: the list's repr
    (digits written by C, whitespace that the array's parser skips), or one value repeated (a
    batch's delays, mostly); a list holding anything but ints is left to psycopg, as
    :func:`text_array`."""
    if not values:
        return "{}"
    if set(map(type, values)) != {int}:
        return values
    first = values[0]
    if values.count(first) == len(values):
        return "{" + ",".join([str(first)] * len(values)) + "}"
    return "{" + repr(values)[1:-1] + "}"
