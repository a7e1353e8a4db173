"""An orders service (SQLAlchemy, sync) that writes an order and its outbox message
in one transaction.

    python examples/orders_sync.py --database-url postgresql://app@localhost/shop \
        --payments-url https://payments.example.com/charges

Without --database-url (or $OUTBOX_DATABASE_URL) it uses the embedded server in
./.outbox/pg, as every outbox command does.

The payment request is sent by `outbox dispatch` once the transaction commits; if
it rolls back, nothing is sent. Run `outbox migrate` first.
"""

from __future__ import annotations

import argparse

from sqlalchemy import BigInteger, Integer, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outbox
from dispatchers.embedded import resolve
from outbox.dsn import sqlalchemy_url


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = {"schema": "shop"}

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    customer: Mapped[str] = mapped_column(String(200))
    total_cents: Mapped[int] = mapped_column(Integer)


box = outbox.Outbox()


def place_order(session: Session, *, customer: str, total_cents: int, payments_url: str) -> int:
    """Insert the order and the request to charge it, in the caller's transaction."""
    order = Order(customer=customer, total_cents=total_cents)
    session.add(order)
    session.flush()  # assigns order.id
    box.enqueue(
        session,
        url=payments_url,
        idempotency_key=f"shop-order-{order.id}-charge",  # stable: retries never charge twice
        json={"order_id": order.id, "amount": total_cents, "currency": "EUR"},
    )
    return order.id


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, else the "
        "embedded server in ./.outbox/pg, as for every outbox command)",
    )
    parser.add_argument(
        "--payments-url", required=True, help="where the outbox message charges the order"
    )
    args = parser.parse_args()
    database_url = resolve(args.database_url).url
    engine = create_engine(sqlalchemy_url(database_url))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS shop")
        Base.metadata.create_all(conn)
    with Session(engine) as session, session.begin():
        order_id = place_order(
            session, customer="ada", total_cents=4200, payments_url=args.payments_url
        )
    with Session(engine) as session:
        count = len(session.scalars(select(Order)).all())
    print(f"order {order_id} committed with its outbox message ({count} orders in total)")
    engine.dispose()


if __name__ == "__main__":
    main()
