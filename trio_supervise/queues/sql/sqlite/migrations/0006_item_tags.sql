-- 0006: tags, labels an item is found by (list_items(tags=...)), as a JSON array of strings.

ALTER TABLE trio_supervise_items ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
