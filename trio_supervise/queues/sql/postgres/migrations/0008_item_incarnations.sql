-- 0008: an item id that is used again names a new incarnation, which no relation of an earlier
-- one ever touches (issue 29).
--
-- Lease versions come from one sequence for the whole schema (trio_supervise_lease_versions), so
-- a version is never handed out twice, whatever item ids come and go: a stale owner's write, a
-- child's default id ("<parent>.<version>.<index>") and a fan-in count-down (by the parent's
-- version) name one incarnation of their item. It starts above every version stored, waited
-- for or held. Each item also records a number of another sequence, drawn when it was inserted
-- (incarnation), and each child its parent's (parent_incarnation): a parent's children are the
-- rows that name its current incarnation. Rows from before this migration are incarnation 0.
--
-- Finished parents no longer wait for children: a parent cancelled while waiting kept its count,
-- so items delete refused it while prune deleted it.
--
-- Each schedule's last enqueued fire, fleet-wide: a fire at or before it is never enqueued again,
-- even once its item is pruned.

CREATE SEQUENCE trio_supervise_lease_versions;
CREATE SEQUENCE trio_supervise_incarnations;
SELECT setval(
    'trio_supervise_lease_versions',
    greatest(coalesce(max(lease_version), 0), coalesce(max(parent_version), 0)) + 1,
    false
) FROM trio_supervise_items;

-- Existing rows are incarnation 0 (a constant default: no table rewrite); rows inserted later
-- draw theirs, whoever inserts them (a worker of the previous release during a rolling upgrade
-- too: the default; this release names one number per statement).
ALTER TABLE trio_supervise_items ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
ALTER TABLE trio_supervise_items
    ALTER COLUMN incarnation SET DEFAULT nextval('trio_supervise_incarnations');
ALTER TABLE trio_supervise_items ADD COLUMN parent_incarnation bigint;

UPDATE trio_supervise_items SET parent_incarnation = 0 WHERE parent_id IS NOT NULL;
UPDATE trio_supervise_items SET waiting_children = 0
WHERE state IN ('completed', 'cancelled', 'dead') AND waiting_children > 0;

CREATE TABLE trio_supervise_schedules (
    name         text        PRIMARY KEY,
    last_fire_at timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
