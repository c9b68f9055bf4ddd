"""The exception family."""

from __future__ import annotations

import pickle

import pytest

import trio_supervise as ts


@pytest.mark.parametrize(
    "error",
    [
        ts.LeaseLost("item-1", 3, "item is running at version 4"),
        ts.ItemNotFound("item-1"),
        ts.DuplicateItem("item-1"),
        ts.ConfigError("bad"),
        ts.QueueUnavailable("down"),
        ts.SchemaError("too new"),
        ts.SettingsError("bad"),
        ts.WorkerFailed("dead"),
        ts.ItemStateError("running"),
    ],
)
def test_every_error_is_a_supervise_error_and_pickles(error: ts.SuperviseError) -> None:
    """Every error belongs to the family and survives pickling (subprocess workers)."""
    assert isinstance(error, ts.SuperviseError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)


def test_lease_lost_names_the_item_and_version() -> None:
    """LeaseLost says which item and which version were refused."""
    error = ts.LeaseLost("abc", 7)
    assert error.item_id == "abc"
    assert error.lease_version == 7
    assert "abc" in str(error)
    assert "7" in str(error)
