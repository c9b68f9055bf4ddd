"""RestartPolicy and keyed jitter: the seed's tests, and Hypothesis properties of the maths."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from trio_supervise import Jitter, JitterMode, RestartPolicy

bounds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
attempts = st.integers(min_value=1, max_value=200)
keys = st.text(max_size=40)
seeds = st.one_of(st.binary(min_size=1, max_size=100), st.text(min_size=1), st.integers())
delays = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)


# -- the seed's tests ----------------------------------------------------------------------------


def test_backoff_doubles_and_caps() -> None:
    """The delay doubles from min_backoff and stops at max_backoff."""
    policy = RestartPolicy(1, 8)
    assert policy.delay(1) == 1
    assert policy.delay(2) == 2
    assert policy.delay(4) == 8
    assert policy.delay(40) == 8


def test_backoff_cap_below_floor_is_raised_to_the_floor() -> None:
    """A max_backoff below min_backoff is raised to it."""
    policy = RestartPolicy(5, 1)
    assert policy.cap == 5
    assert policy.delay(1) == 5
    assert policy.delay(9) == 5


def test_jitter_stays_within_the_upper_half_of_the_delay() -> None:
    """Equal jitter spreads a delay over [delay / 2, delay]."""
    jitter = Jitter()
    for attempt in range(64):
        jittered = jitter.spread(1.0, key="jittered-worker", attempt=attempt)
        assert 0.5 <= jittered <= 1.0


def test_jitter_differs_between_workers_backing_off_together() -> None:
    """Workers backing off in the same instant draw different delays."""
    jitter = Jitter()
    draws = {jitter.spread(30.0, key=f"same-instant-{i}", attempt=0) for i in range(16)}
    assert len(draws) > 1, "every worker drew the same backoff"


def test_jitter_differs_between_attempts_of_one_worker() -> None:
    """One worker's successive attempts draw different delays."""
    jitter = Jitter()
    draws = {jitter.spread(30.0, key="retrying-worker", attempt=i) for i in range(16)}
    assert len(draws) > 1, "every attempt drew the same backoff"


def test_jitter_is_stable_for_one_key() -> None:
    """The draw is a function of the key, not of the moment it is drawn."""
    jitter = Jitter()
    assert jitter.spread(30.0, key="keyed-worker", attempt=3) == jitter.spread(
        30.0, key="keyed-worker", attempt=3
    )


# -- the policy ----------------------------------------------------------------------------------


def test_defaults_match_the_seed() -> None:
    """Ten consecutive restarts and equal jitter unless told otherwise."""
    policy = RestartPolicy(1, 60)
    assert policy.max_restarts == RestartPolicy.DEFAULT_MAX_RESTARTS == 10
    assert policy.jitter is JitterMode.EQUAL


def test_attempts_below_one_count_as_one() -> None:
    """Attempt 0 or below gets the first delay rather than a fraction of it."""
    policy = RestartPolicy(2, 100)
    assert policy.delay(0) == policy.delay(-5) == 2


def test_doubling_stops_after_31_doublings() -> None:
    """The exponent is capped at 31, as in the seed, so huge attempts are cheap and exact."""
    policy = RestartPolicy(1e-9, 1e9)
    assert policy.delay(32) == 1e-9 * 2**31
    assert policy.delay(10**9) == 1e-9 * 2**31


@pytest.mark.parametrize("field", ["min_backoff", "max_backoff"])
@pytest.mark.parametrize("value", [-1, -0.001, math.nan, math.inf, -math.inf])
def test_bad_bounds_are_refused_naming_the_field(field: str, value: float) -> None:
    """Negative, NaN or infinite bounds raise ValueError naming the field."""
    arguments = {"min_backoff": 1.0, "max_backoff": 2.0, field: value}
    with pytest.raises(ValueError, match=field):
        RestartPolicy(**arguments)


@pytest.mark.parametrize(
    ("arguments", "error", "field"),
    [
        ({"max_restarts": -1}, ValueError, "max_restarts"),
        ({"max_restarts": 1.5}, TypeError, "max_restarts"),
        ({"max_restarts": True}, TypeError, "max_restarts"),
        ({"min_backoff": "1"}, TypeError, "min_backoff"),
        ({"max_backoff": True}, TypeError, "max_backoff"),
        ({"jitter": "sideways"}, ValueError, "JitterMode"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(
    arguments: dict[str, object], error: type[Exception], field: str
) -> None:
    """Wrong types and out-of-range values raise at construction, naming the field."""
    full: dict[str, object] = {"min_backoff": 1.0, "max_backoff": 2.0, **arguments}
    with pytest.raises(error, match=field):
        RestartPolicy(**full)  # type: ignore[arg-type]


def test_zero_restarts_and_zero_backoff_are_allowed() -> None:
    """max_restarts=0 (never restart) and a zero backoff are valid policies."""
    policy = RestartPolicy(0, 0, max_restarts=0)
    assert policy.delay(5) == 0
    assert policy.backoff(5, key="w", jitter=Jitter(seed=1)) == 0


@given(bounds, bounds, attempts)
def test_delay_is_non_decreasing_in_the_attempt(lo: float, hi: float, attempt: int) -> None:
    """Each attempt waits at least as long as the one before."""
    policy = RestartPolicy(lo, hi)
    assert policy.delay(attempt) <= policy.delay(attempt + 1)


@given(bounds, bounds)
def test_delay_starts_at_min_backoff(lo: float, hi: float) -> None:
    """The first restart waits exactly min_backoff."""
    assert RestartPolicy(lo, hi).delay(1) == lo


@given(bounds, bounds, attempts)
def test_delay_never_exceeds_the_cap(lo: float, hi: float, attempt: int) -> None:
    """No delay exceeds the larger of the two bounds, and the cap is reached eventually."""
    policy = RestartPolicy(lo, hi)
    assert policy.cap == max(lo, hi)
    assert policy.delay(attempt) <= policy.cap
    if lo > 0:
        assert policy.delay(10_000) == policy.cap or policy.delay(10_000) == lo * 2**31


@given(bounds, bounds, attempts)
def test_delay_follows_the_formula(lo: float, hi: float, attempt: int) -> None:
    """delay(n) = min_backoff * 2**min(n - 1, 31), capped."""
    policy = RestartPolicy(lo, hi)
    assert policy.delay(attempt) == min(lo * 2 ** min(attempt - 1, 31), max(lo, hi))


# -- jitter --------------------------------------------------------------------------------------


@given(seeds, keys, st.integers(), delays)
def test_jitter_stays_in_its_modes_interval(
    seed: bytes | str | int, key: str, attempt: int, delay: float
) -> None:
    """Equal jitter lands in [delay/2, delay], full in [0, delay], none on delay exactly."""
    jitter = Jitter(seed=seed)
    assert 0 <= jitter.draw(key, attempt) <= 1
    assert delay / 2 <= jitter.spread(delay, key=key, attempt=attempt) <= delay
    assert 0 <= jitter.spread(delay, key=key, attempt=attempt, mode=JitterMode.FULL) <= delay
    assert jitter.spread(delay, key=key, attempt=attempt, mode=JitterMode.NONE) == delay


@given(seeds, keys, st.integers())
def test_jitter_is_stable_per_key_and_seed(seed: bytes | str | int, key: str, attempt: int) -> None:
    """The same seed, key and attempt give the same draw, from any Jitter holding that seed."""
    assert Jitter(seed=seed).draw(key, attempt) == Jitter(seed=seed).draw(key, attempt)


@given(seeds, keys, keys, st.integers(), st.integers())
def test_jitter_varies_across_keys_and_attempts(
    seed: bytes | str | int, key_a: str, key_b: str, attempt_a: int, attempt_b: int
) -> None:
    """Different (key, attempt) pairs give different draws under one seed."""
    assume((key_a, attempt_a) != (key_b, attempt_b))
    jitter = Jitter(seed=seed)
    assert jitter.draw(key_a, attempt_a) != jitter.draw(key_b, attempt_b)


@given(st.binary(min_size=1, max_size=200), st.binary(min_size=1, max_size=200), keys)
def test_jitter_varies_across_seeds(seed_a: bytes, seed_b: bytes, key: str) -> None:
    """Replicas with different seeds draw differently for the same key, even for long seeds."""
    assume(seed_a != seed_b)
    assert Jitter(seed=seed_a).draw(key, 1) != Jitter(seed=seed_b).draw(key, 1)


def test_the_default_seed_is_random_per_jitter() -> None:
    """Two default jitters (two processes, in effect) draw differently."""
    assert Jitter().draw("w", 1) != Jitter().draw("w", 1)


def test_jitter_refuses_a_seed_of_the_wrong_type() -> None:
    """A seed that is not bytes, str, int or None raises TypeError naming it."""
    with pytest.raises(TypeError, match="seed"):
        Jitter(seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        Jitter(seed=True)


@given(seeds, bounds, bounds, attempts, keys)
def test_policy_backoff_is_the_jittered_delay(
    seed: bytes | str | int, lo: float, hi: float, attempt: int, key: str
) -> None:
    """policy.backoff spreads policy.delay with the policy's mode and the (key, attempt) draw."""
    jitter = Jitter(seed=seed)
    for mode in JitterMode:
        policy = RestartPolicy(lo, hi, jitter=mode)
        assert policy.backoff(attempt, key=key, jitter=jitter) == jitter.spread(
            policy.delay(attempt), key=key, attempt=attempt, mode=mode
        )


def test_seeds_longer_than_a_blake2b_key_still_count_in_full() -> None:
    """Two long seeds that share their first 64 bytes still draw differently."""
    prefix = b"x" * 64
    assert Jitter(seed=prefix + b"a").draw("w", 1) != Jitter(seed=prefix + b"b").draw("w", 1)
