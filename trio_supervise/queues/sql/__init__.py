"""The SQL layer: the store's ports written once over SQLite and PostgreSQL.

Each port is a mixin over one base that holds the dialect's hooks; each dialect is one class
with its hooks. The dialects' SQL (``queries.sql``, ``schema.sql``, ``migrations/``) is data
in ``sqlite/`` and ``postgres/`` beside this code. The contract is in ``docs/queues.md``.
"""
