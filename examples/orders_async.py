"""The orders service with async SQLAlchemy: the same transaction, awaited.

    python examples/orders_async.py --database-url postgresql://app@localhost/shop \
        --payments-url https://payments.example.com/charges

Without --database-url it uses the embedded server, as orders_sync.py does.
"""

from __future__ import annotations

import argparse
import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import outbox
from dispatchers.embedded import resolve
from outbox.dsn import sqlalchemy_url

box = outbox.Outbox()


async def place_order(
    session: AsyncSession, *, customer: str, total_cents: int, payments_url: str
) -> int:
    result = await session.execute(
        text("INSERT INTO shop_async.orders (customer, total_cents) VALUES (:c, :t) RETURNING id"),
        {"c": customer, "t": total_cents},
    )
    order_id = int(result.scalar_one())
    await box.enqueue_async(
        session,
        url=payments_url,
        idempotency_key=f"shop-async-order-{order_id}-charge",  # distinct from orders_sync.py
        json={"order_id": order_id, "amount": total_cents, "currency": "EUR"},
    )
    return order_id


async def main() -> None:
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
    engine = create_async_engine(sqlalchemy_url(database_url))
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA IF NOT EXISTS shop_async"))
        await conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS shop_async.orders (id bigserial PRIMARY KEY,"
                " customer text NOT NULL, total_cents integer NOT NULL)"
            )
        )
    async with AsyncSession(engine) as session, session.begin():
        order_id = await place_order(
            session, customer="grace", total_cents=990, payments_url=args.payments_url
        )
    print(f"order {order_id} committed with its outbox message")
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
