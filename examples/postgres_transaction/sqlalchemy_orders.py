"""SQLAlchemy: an order and its receipt job committed in one transaction, or neither.

The job row is inserted with the session's own psycopg connection, so the
session's commit makes both visible (and wakes a worker), and a rollback, an
exception or a crash before commit leaves neither. Needs the psycopg dialect
(``postgresql+psycopg://``)::

    engine = create_engine("postgresql+psycopg://app@localhost/app")
    with Session(engine) as session, session.begin():
        place_order(session, "book")
"""

from __future__ import annotations

import functools
import os

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from hermes.core import Message, connect
from hermes.drivers.postgres import PostgresDriver


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = os.environ.get("ORDERS_TABLE", "example_orders")

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))


@functools.cache
def jobs() -> PostgresDriver:
    """The process's driver: its own pool for workers and plain sends."""
    driver = connect(os.environ.get("HERMES_URL", "postgresql://localhost/app"))
    assert isinstance(driver, PostgresDriver), "HERMES_URL must be a postgresql:// URL"
    return driver


def emit_in_session(session: Session, message: Message) -> None:
    """Insert ``message`` in ``session``'s transaction (the connection under SQLAlchemy's)."""
    raw = session.connection().connection.driver_connection
    jobs().send_in(raw, message)  # type: ignore[arg-type]


def place_order(session: Session, item: str) -> Order:
    order = Order(item=item)
    session.add(order)
    session.flush()  # the order's id, for the job
    emit_in_session(session, Message("send-receipt", {"order": order.id, "item": item}))
    return order
