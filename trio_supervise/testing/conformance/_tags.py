"""Tags: labels an item carries, stored as given and found by ``list_items(tags=...)``."""

from __future__ import annotations

import pytest

from ... import ConfigError
from ...job import MAX_NAME_LENGTH, MAX_TAGS, ItemState, NewItem
from ...queues import WorkQueue


class TagsContract:
    """Tags are stored in the order given (a repeat kept once), come back from every read and
    claim, and filter listings: an item is listed when it carries every tag asked for."""

    async def test_tags_come_back_from_every_read(self, queue: WorkQueue) -> None:
        """Enqueue's item, a read, a claim and a listing all carry the tags as given, a
        repeated one kept once; an item given none has none."""
        item = await queue.enqueue("spec", item_id="a", tags=["red", "big", "red"])
        assert item.tags == ("red", "big")
        [plain] = await queue.enqueue_many([NewItem(spec_id="spec", item_id="b")])
        assert plain.item.tags == ()
        assert (await queue.get("a")).tags == ("red", "big")
        [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
        assert (claimed.id, claimed.tags) == ("a", ("red", "big"))
        assert [i.tags for i in await queue.list_items()] == [("red", "big"), ()]

    async def test_listing_by_tags_finds_items_carrying_them_all(self, queue: WorkQueue) -> None:
        """``tags=[...]`` lists the items carrying every one of them, with the other filters
        and the cursor as before; no tags (None or empty) filters nothing."""
        await queue.enqueue("spec", item_id="a", tags=("red",))
        await queue.enqueue("spec", item_id="b", tags=("red", "big"))
        await queue.enqueue("other", item_id="c", tags=("big", "red"))
        await queue.enqueue("spec", item_id="d")

        async def ids(**filters: object) -> list[str]:
            return [item.id for item in await queue.list_items(**filters)]  # type: ignore[arg-type]

        assert await ids(tags=["red"]) == ["a", "b", "c"]
        assert await ids(tags=["red", "big"]) == ["b", "c"]
        assert await ids(tags=["big"], spec_ids=["spec"]) == ["b"]
        assert await ids(tags=["red"], after="a", limit=1) == ["b"]
        assert await ids(tags=["red"], states=[ItemState.RUNNING]) == []
        assert await ids(tags=["blue"]) == []
        assert await ids(tags=[]) == await ids(tags=None) == ["a", "b", "c", "d"]

    @pytest.mark.parametrize(
        ("tags", "rule"),
        [
            ("red", "tags must be a list of strings"),
            ([""], "each tag must be a non-empty string"),
            (["t" * (MAX_NAME_LENGTH + 1)], "each tag must be a non-empty string"),
            ([1], "each tag must be a non-empty string"),
            ([f"t{n}" for n in range(MAX_TAGS + 1)], f"tags must be at most {MAX_TAGS} distinct"),
        ],
    )
    async def test_bad_tags_are_refused_naming_the_rule(
        self, queue: WorkQueue, tags: object, rule: str
    ) -> None:
        """A bare string, an empty or over-long tag, a tag that is not a string, or too many:
        refused before anything is written, alone or in a batch, and as a listing's filter."""
        with pytest.raises(ValueError, match=rule):
            await queue.enqueue("spec", tags=tags)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"entry 1: {rule}"):
            await queue.enqueue_many([NewItem(spec_id="spec"), NewItem(spec_id="spec", tags=tags)])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rule):
            await queue.list_items(tags=tags)  # type: ignore[arg-type]
        assert await queue.counts() == {}

    async def test_a_tag_no_backend_can_store_is_refused(self, queue: WorkQueue) -> None:
        """A NUL or a lone surrogate in a tag is a ConfigError naming the field."""
        for bad in ("a\x00b", "bad \udcff"):
            with pytest.raises(ConfigError, match="each tag must not contain"):
                await queue.enqueue("spec", tags=[bad])
        assert await queue.counts() == {}
