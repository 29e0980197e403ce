"""Django (4.2+ with psycopg 3): an order and its receipt job in one ``transaction.atomic()``.

``django.db.connection.connection`` is the psycopg connection Django runs the
block's statements on, so the job row commits with the block and is never
seen if the block raises. No ``transaction.on_commit`` is needed, and none of
its crash window: the job is not a second write after the commit.
"""

from __future__ import annotations

import functools
import os

from django.db import connection, transaction

from hermes.core import Message, connect
from hermes.drivers.postgres import PostgresDriver


@functools.cache
def jobs() -> PostgresDriver:
    driver = connect(os.environ["HERMES_URL"])
    assert isinstance(driver, PostgresDriver), "HERMES_URL must be a postgresql:// URL"
    return driver


def place_order(item: str, fail: bool = False) -> None:
    orders = os.environ.get("ORDERS_TABLE", "example_orders")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {orders} (item) VALUES (%s) RETURNING id", [item])
            (order_id,) = cursor.fetchone()
        connection.ensure_connection()
        jobs().send_in(connection.connection, Message("send-receipt", {"order": order_id}))
        if fail:
            raise RuntimeError("the view failed after emitting: nothing is committed")
