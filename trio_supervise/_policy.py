"""Restart policies: capped exponential backoff with keyed, deterministic jitter.

The same maths serves workers (keyed by worker name and attempt) and work items (keyed by item id
and error count).
"""

from __future__ import annotations

import enum
import hashlib
import math
import secrets

import attrs

__all__ = ["Jitter", "JitterMode", "RestartPolicy"]

_MAX_DOUBLINGS = 31
_MAX_KEY_BYTES = 64  # blake2b's limit


class JitterMode(enum.StrEnum):
    """How a backoff is spread."""

    EQUAL = "equal"
    """Uniform in ``[delay / 2, delay]``: never much shorter than planned (the default)."""
    FULL = "full"
    """Uniform in ``[0, delay]``: spreads a herd the widest, at the price of short waits."""
    NONE = "none"
    """Exactly ``delay``."""


def _to_jitter_mode(value: object) -> JitterMode:
    try:
        return JitterMode(value)  # type: ignore[arg-type]
    except ValueError:
        allowed = ", ".join(repr(mode.value) for mode in JitterMode)
        raise ValueError(f"jitter must be a JitterMode (one of {allowed}), got {value!r}") from None


def _finite_non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _non_negative_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class RestartPolicy:
    """Restart with exponential backoff: doubling from ``min_backoff``, capped at :attr:`cap`.

    :param min_backoff: seconds before the first restart.
    :param max_backoff: the cap in seconds; a value below ``min_backoff`` is raised to it.
    :param max_restarts: consecutive rapid restarts allowed before the loud path. A run that
        lasts at least :attr:`cap` counts as a recovery and resets the count.
    :param jitter: how each delay is spread (see :class:`JitterMode`).
    """

    DEFAULT_MAX_RESTARTS = 10

    min_backoff: float = attrs.field(validator=_finite_non_negative)
    max_backoff: float = attrs.field(validator=_finite_non_negative)
    max_restarts: int = attrs.field(
        default=DEFAULT_MAX_RESTARTS, validator=_non_negative_int, kw_only=True
    )
    jitter: JitterMode = attrs.field(
        default=JitterMode.EQUAL, converter=_to_jitter_mode, kw_only=True
    )

    @property
    def cap(self) -> float:
        """The largest delay: the larger of the two bounds."""
        return max(self.min_backoff, self.max_backoff)

    def delay(self, attempt: int) -> float:
        """The un-jittered delay before restart number *attempt* (1-based).

        ``min_backoff * 2 ** min(attempt - 1, 31)``, capped at :attr:`cap`; attempts below 1 count
        as 1.
        """
        doublings = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
        return min(self.min_backoff * (1 << doublings), self.cap)

    def backoff(self, attempt: int, *, key: str, jitter: Jitter) -> float:
        """The jittered delay before restart *attempt* of whatever *key* names."""
        return jitter.spread(self.delay(attempt), key=key, attempt=attempt, mode=self.jitter)


def _seed_bytes(seed: bytes | str | int | None) -> bytes:
    if seed is None:
        return secrets.token_bytes(16)
    if isinstance(seed, bytes):
        return seed
    if isinstance(seed, str):
        return seed.encode()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be bytes, str, int or None, got {seed!r}")
    return seed.to_bytes((seed.bit_length() + 8) // 8, "big", signed=True)


@attrs.frozen
class Jitter:
    """Keyed, deterministic jitter: the draw is a keyed hash of ``(key, attempt)`` under a seed.

    The same key and attempt give the same draw; different keys or attempts give different draws;
    a different seed (another replica) gives different draws. The seed is random by default and
    can be fixed for tests or to replay an incident. There is no global state: whoever owns the
    ``Jitter`` (a supervisor, a runner) owns the seed.
    """

    seed: bytes = attrs.field(default=None, converter=_seed_bytes, repr=False)
    _key: bytes = attrs.field(init=False, repr=False, eq=False)

    @_key.default
    def _derive_key(self) -> bytes:
        # blake2b takes a key of at most 64 bytes: hash a longer seed down rather than cut it,
        # so every byte of the seed counts.
        if len(self.seed) <= _MAX_KEY_BYTES:
            return self.seed
        return hashlib.blake2b(self.seed, digest_size=_MAX_KEY_BYTES).digest()

    def draw(self, key: str, attempt: int) -> float:
        """A number in ``[0, 1]`` fixed by ``(seed, key, attempt)``."""
        digest = hashlib.blake2b(
            f"{key}\x00{attempt}".encode(), key=self._key, digest_size=8
        ).digest()
        return int.from_bytes(digest, "big") / float(2**64 - 1)

    def spread(
        self, delay: float, *, key: str, attempt: int, mode: JitterMode = JitterMode.EQUAL
    ) -> float:
        """Spread *delay* per *mode* with the draw for ``(key, attempt)``."""
        if mode is JitterMode.NONE or delay <= 0:
            return delay
        fraction = self.draw(key, attempt)
        if mode is JitterMode.FULL:
            return delay * fraction
        half = delay / 2
        return half + half * fraction
