"""Hermes on PostgreSQL: a messages table, SKIP LOCKED leases, LISTEN/NOTIFY wake-up.

``connect("postgresql://app@localhost:5432/app")`` builds a
:class:`PostgresDriver`; :meth:`PostgresDriver.send_in` emits with the
application's own connection, inside its transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.postgres._driver import PostgresDriver, TableBrowser
    from hermes.drivers.postgres._schema import create_sql

__all__ = ["PostgresDriver", "TableBrowser", "create_sql"]

# Loading the plugin imports this package; psycopg is imported on first use of a
# name instead, so a process that never uses this broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "PostgresDriver": "._driver",
            "TableBrowser": "._driver",
            "create_sql": "._schema",
        },
    )
