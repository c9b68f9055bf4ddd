-- 0005: claims walk queued rows only. The claim index held running rows too, and they sit at
-- its head (the oldest due_at), so every claim visited every in-flight row (a heap fetch each,
-- to test its lease) before the first claimable one. Now the claim index holds queued rows
-- only, and a claim finds the running rows whose lease has expired in an index of their own,
-- by lease expiry: with no lease expired, one probe.

DROP INDEX trio_supervise_items_claim_idx;

-- Serves claims: one queue's queued items in (priority, due_at, id) order; lower priority
-- numbers first.
CREATE INDEX trio_supervise_items_claim_idx
    ON trio_supervise_items (queue, priority, due_at, id)
    WHERE state = 'queued';

-- Serves the rescue of expired leases by claims: one queue's running items by lease expiry.
CREATE INDEX trio_supervise_items_lease_idx
    ON trio_supervise_items (queue, lease_expires_at)
    WHERE state = 'running';
