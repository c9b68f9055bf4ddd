"""Rate limits per concurrency key: which rule holds a key, and how many of a claim's items of
each key may start (the one rule of ``_rates.py``, per key).

A *rule* is a concurrency key (``"tenant:acme"``) or a template over the item's tenant and
subject, as a driver's ``concurrency_key`` is (``"partner:{tenant}"``). A template gives every
key it renders a window of its own: ``"partner:{tenant}"`` at ``100/60s`` lets 100 items of
``partner:acme`` and 100 of ``partner:globex`` start per minute. A key is held by its most
specific rule (:func:`rule_for`): the key itself, else the template with the most literal
text. Each key keeps the log of its latest starts, as a rate-limited queue does.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._checks import check_name
from ._rates import RateLimit, admitted, recorded

__all__ = [
    "KEY_TEMPLATE_FIELDS",
    "cap_of",
    "check_key_rule",
    "check_prune_limit",
    "key_caps",
    "key_logs_after",
    "rule_for",
]

KEY_TEMPLATE_FIELDS = ("tenant", "subject")
"""The fields a key rule's template may name, as a driver's ``concurrency_key`` template."""

_ANY = 2**31 - 1
"""No limit from a key rule (the cap of a key no rule holds)."""


def check_key_rule(rule: object) -> str:
    """*rule* (a concurrency key or a template naming only ``{tenant}`` and ``{subject}``) as
    stored; else a ``ValueError`` naming the rule."""
    rule = check_name(rule, "key rate limit's key")
    try:
        parts = list(string.Formatter().parse(rule))
    except ValueError as error:
        raise ValueError(
            f"key rate limit's key must be a key or a template over {{tenant}} and "
            f"{{subject}} ({error}), got {rule!r}"
        ) from None
    for _, field, spec, conversion in parts:
        if field is not None and (field not in KEY_TEMPLATE_FIELDS or spec or conversion):
            raise ValueError(
                f"key rate limit's key may name only {{tenant}} and {{subject}}, got {rule!r}"
            )
    return rule


def check_prune_limit(limit: object) -> int | None:
    """``prune_key_logs``'s *limit*, checked the same way by every store."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an integer >= 1, got {limit!r}")
    return limit


@functools.lru_cache(maxsize=1024)
def _pattern(rule: str) -> tuple[re.Pattern[str], int, int]:
    """The rule as a pattern over keys, with its rank (placeholders, literal characters)."""
    out, literal, fields = [], 0, 0
    for text, field, _, _ in string.Formatter().parse(rule):
        out.append(re.escape(text))
        literal += len(text)
        if field is not None:
            out.append("(?:.+)")
            fields += 1
    return re.compile("".join(out), re.DOTALL), fields, literal


def rule_for(key: str, rules: Sequence[str]) -> str | None:
    """The rule holding *key*: the key itself if it is a rule, else the matching template with
    the most literal text (then the fewest placeholders, then the first in order); None if no
    rule matches."""
    best: tuple[int, int, str] | None = None
    for rule in rules:
        pattern, fields, literal = _pattern(rule)
        if rule == key or (fields and pattern.fullmatch(key)):
            rank = (0 if rule == key else 1, -literal, rule)
            if best is None or rank < (best[0], best[1], best[2]):
                best = rank
    return None if best is None else best[2]


def key_caps(
    keys: Sequence[str],
    rules: Mapping[str, RateLimit],
    logs: Mapping[str, Sequence[dt.datetime]],
    now: dt.datetime,
) -> dict[str, tuple[RateLimit, list[dt.datetime], dt.datetime, int]]:
    """Per key of *keys* that a rule holds: its rate, the starts still in its window, the time
    to record its starts at and how many of its items may start now (``admitted``)."""
    names = sorted(rules)
    out = {}
    for key in keys:
        rule = rule_for(key, names)
        if rule is not None:
            rate = rules[rule]
            out[key] = (rate, *admitted(logs.get(key, ()), rate, now))
    return out


def key_logs_after(
    caps: Mapping[str, tuple[RateLimit, list[dt.datetime], dt.datetime, int]],
    claimed: Iterable[Any],
) -> dict[str, list[dt.datetime]]:
    """The new log of each key of *caps* that the *claimed* items started (``recorded``)."""
    started: dict[str, int] = {}
    for item in claimed:
        if item.concurrency_key in caps:
            started[item.concurrency_key] = started.get(item.concurrency_key, 0) + 1
    logs = {}
    for key, count in started.items():
        rate, kept, at, _ = caps[key]
        logs[key] = recorded(kept, at, count, rate)
    return logs


def cap_of(caps: Mapping[str, tuple[object, object, object, int]], key: str | None) -> int:
    """How many items of *key* may start, by its rule (a very large number if none)."""
    found = None if key is None else caps.get(key)
    return _ANY if found is None else found[3]
