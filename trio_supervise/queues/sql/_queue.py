"""The four ports and the audit trail joined: :class:`SQLQueue`, what each SQL dialect subclasses.

A dialect (:class:`SQLiteQueue`, :class:`PostgresQueue`) adds its connections, its hooks (the
base's and each port's, see ``_base.py``) and its own ``connect`` and ``aclose``.
"""

from __future__ import annotations

from ._audit import SQLAudit
from ._durable import SQLDurable
from ._maintenance import SQLMaintenance
from ._operator import SQLOperator
from ._producer import SQLProducer
from ._worker import SQLWorker

__all__ = ["SQLQueue"]


class SQLQueue(SQLWorker, SQLProducer, SQLOperator, SQLMaintenance, SQLAudit, SQLDurable):
    """The :class:`WorkQueue` protocol over a SQL dialect: every port, written once."""
