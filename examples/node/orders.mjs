// An orders service in Node.js: it writes an order and publishes its event in
// one transaction, through the outbox's SQL function. `outbox dispatch` then
// sends the event, signed, to every endpoint subscribed to "order.created".
//
//   npm ci --prefix examples/node
//   DATABASE_URL=postgresql://shop_app@localhost/shop node examples/node/orders.mjs
//
// Without DATABASE_URL, node-postgres reads PGHOST, PGUSER, PGDATABASE... Run
// `outbox migrate` first. The role needs INSERT on shop.orders, and from
// `outbox roles --producer ROLE`, EXECUTE on outbox.publish: nothing more.
import process from "node:process";
import pg from "pg";

const client = new pg.Client(process.env.DATABASE_URL ? { connectionString: process.env.DATABASE_URL } : {});

async function placeOrder(customer, totalCents) {
  await client.query("BEGIN");
  try {
    const { rows: [order] } = await client.query(
      "INSERT INTO shop.orders (customer, total_cents) VALUES ($1, $2) RETURNING id",
      [customer, totalCents],
    );
    // the event key is stable: publishing it again (a retry) writes nothing
    const { rows: [published] } = await client.query(
      `SELECT outbox.publish(event_type => 'order.created',
                             payload => $1::jsonb,
                             idempotency_key => $2) AS message_ids`,
      [JSON.stringify({ order_id: Number(order.id), customer, total_cents: totalCents }),
       `shop-order-${order.id}-created`],
    );
    await client.query("COMMIT");
    return { orderId: Number(order.id), messageIds: published.message_ids.map(Number) };
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  }
}

await client.connect();
try {
  await client.query(
    `CREATE SCHEMA IF NOT EXISTS shop;
     CREATE TABLE IF NOT EXISTS shop.orders (
         id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         customer text NOT NULL,
         total_cents integer NOT NULL)`,
  );
  const { orderId, messageIds } = await placeOrder("ada", 4200);
  console.log(`order ${orderId} committed with ${messageIds.length} webhook message(s): ${messageIds.join(", ")}`);
} catch (error) {
  // an outbox refusal names its field: SQLSTATE OB001 (bad input), OB002 (a key reused)
  console.error(`${error.code ?? "error"}: ${error.message}`);
  process.exitCode = 1;
} finally {
  await client.end();
}
