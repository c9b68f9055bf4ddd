"""Chaos, fault and bad-input figures: ``python -m benchmarks.chaos [--quick] [--json PATH]``.

R1 drains a queue (SQLite, then PostgreSQL) with four worker processes while a random one is
SIGKILLed (or, every fourth time, SIGSTOPped past its lease) every ~2 s and restarted, and audits
every item afterwards. R2 terminates the PostgreSQL workers' connections repeatedly and stops the
server for a bounded window. See ``docs/reliability.md`` for what each figure means.
"""
