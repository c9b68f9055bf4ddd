-- 0007: running items leave the spec index and the listing index. A claim (queued -> running)
-- and a settlement (running -> finished or queued) change indexed columns, so neither is a HOT
-- update: each writes an entry into every index whose predicate the new row version matches.
-- With running rows in (spec_id, state) and (state, due_at, id), a claim wrote four index
-- entries (the key, the lease index and these two); now it writes two. The running rows are the
-- leases in flight, all of them in the lease index, (queue, lease_expires_at) WHERE state =
-- 'running': the reads of running rows (listing them, next_due_at's earliest lease) read them
-- from there, sorting what they need.
--
-- Each index is built under a new name before the old one is dropped, so the table's reads wait
-- only for the drops and renames at the end (its writes wait for the builds: CREATE INDEX holds
-- a SHARE lock).

CREATE INDEX trio_supervise_items_spec_state_idx_0007
    ON trio_supervise_items (spec_id, state)
    WHERE state <> 'running';

CREATE INDEX trio_supervise_items_state_due_idx_0007
    ON trio_supervise_items (state, due_at, id)
    WHERE state <> 'running';

DROP INDEX trio_supervise_items_spec_state_idx;
DROP INDEX trio_supervise_items_state_due_idx;
ALTER INDEX trio_supervise_items_spec_state_idx_0007 RENAME TO trio_supervise_items_spec_state_idx;
ALTER INDEX trio_supervise_items_state_due_idx_0007 RENAME TO trio_supervise_items_state_due_idx;
