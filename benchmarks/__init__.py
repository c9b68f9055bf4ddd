"""Side-by-side benchmarks of trio_supervise: ``python -m benchmarks [--quick] [--json PATH]``.

Every measure runs its baseline in the same invocation, on the same machine and database, and
reports ``ratio = ours / baseline`` with the direction that is good (``better``) and the goal.
See ``docs/benchmarks.md``. One module per family:

- :mod:`benchmarks.memory`: P1 (memory-queue runner against a bare nursery) and P4 (a simulated
  year under the autojump clock);
- :mod:`benchmarks.postgres`: P2 (against Procrastinate), P2f (against the raw SQL floor), P6
  (latency with NOTIFY against a raw LISTEN/NOTIFY round trip), P7 (two worker processes
  against one), P8 (against PgQueuer, run by :mod:`benchmarks._pgqueuer`);
- :mod:`benchmarks.sqlite`: P3 (against the raw SQLite floor);
- :mod:`benchmarks.scale`: P9 (claims and ``/metrics`` + ``/`` with a big table);
- :mod:`benchmarks.bulk`: P10 (bulk enqueue against a multi-row INSERT floor);
- :mod:`benchmarks.inflight`: P11 (10,000 leases in flight: renewal round, memory);
- :mod:`benchmarks.flow`: P13 (an unlimited queue beside a rate-limited backlog) and P13r (the
  rate achieved against the limit), SQLite and PostgreSQL;
- :mod:`benchmarks.durable`: P12 (durable workflow steps against the runner's items, SQLite and
  PostgreSQL);
- :mod:`benchmarks.supervision`: P5 (memory per idle supervised worker; retired, ``--only P5``).

And beside them, :mod:`benchmarks.instructions` (``python -m benchmarks.instructions``): P1's and
P4's instructions per item, counted by valgrind's callgrind, for the ratio without the machine's
noise.
"""
