"""Side-by-side benchmarks of trio_supervise: ``python -m benchmarks [--quick] [--json PATH]``.

Every measure runs its baseline in the same invocation, on the same machine and database, and
reports ``ratio = ours / baseline`` with the direction that is good (``better``) and the goal.
See ``docs/benchmarks.md``. One module per family:

- :mod:`benchmarks.memory`: P1 (memory-queue runner against a bare nursery) and P4 (a simulated
  year under the autojump clock);
- :mod:`benchmarks.postgres`: P2 (against Procrastinate), P2f (against the raw SQL floor), P6
  (latency with NOTIFY), P7 (two worker processes against one);
- :mod:`benchmarks.sqlite`: P3 (against the raw SQLite floor);
- :mod:`benchmarks.supervision`: P5 (memory per idle supervised worker).
"""
