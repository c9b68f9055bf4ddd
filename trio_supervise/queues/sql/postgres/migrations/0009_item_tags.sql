-- 0009: tags, labels an item is found by (list_items(tags=...)), as a JSON array of strings.
-- Adding a column with a constant default rewrites nothing (PostgreSQL 11 and later).

ALTER TABLE trio_supervise_items ADD COLUMN tags jsonb NOT NULL DEFAULT '[]'::jsonb;
