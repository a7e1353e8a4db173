"""A webhook receiver that verifies Standard Webhooks signatures and applies each
event exactly once: the inbox claim and the effect commit in one transaction.

    python examples/webhook_receiver.py --database-url postgresql://hooks@localhost/crm \
        --secret whsec_... --port 8000

Duplicates (the same webhook-id again) are answered 200 without re-applying.
Each request is handled in a server span whose parent is the dispatcher's
attempt (``extract_context``), so the effect joins the sender's trace once an
OpenTelemetry SDK is configured (needs ``pip install 'pg-outbox[dispatcher,otel]'``).
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from opentelemetry import trace

from dispatchers.embedded import resolve
from outbox.receiver import Inbox, InvalidSignature, extract_context, verify

inbox = Inbox(schema="crm_inbox")
tracer = trace.get_tracer("webhook_receiver")
KEEP_KEYS = timedelta(days=30)  # longer than any sender retries or replays


def apply_event(conn: psycopg.Connection[Any], webhook_id: str, event: dict[str, Any]) -> None:
    """The business effect: here, one row per event."""
    conn.execute(
        "INSERT INTO crm_inbox.events (webhook_id, type, data) VALUES (%s, %s, %s)",
        (webhook_id, event["type"], json.dumps(event["data"])),
    )


def make_handler(database_url: str, secret: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            with tracer.start_as_current_span(
                "POST /hooks",
                context=extract_context(dict(self.headers.items())),
                kind=trace.SpanKind.SERVER,
            ):
                self.handle_event()

        def handle_event(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                verify(secret, dict(self.headers.items()), body)
            except InvalidSignature as exc:
                return self.reply(401, str(exc))
            webhook_id = self.headers["webhook-id"]
            with psycopg.connect(database_url) as conn, conn.transaction():
                if inbox.claim(conn, webhook_id):
                    apply_event(conn, webhook_id, json.loads(body))
                    return self.reply(200, "applied")
            return self.reply(200, "duplicate")

        def reply(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # never log payloads

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, else the "
        "embedded server in ./.outbox/pg, as for every outbox command)",
    )
    parser.add_argument("--secret", required=True, help="the endpoint's whsec_ secret")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to listen on, 0 for any free one (default: %(default)s)",
    )
    args = parser.parse_args()
    database_url = resolve(args.database_url).url
    with psycopg.connect(database_url) as conn:
        inbox.ensure_schema(conn)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS crm_inbox.events (webhook_id text PRIMARY KEY,"
            " type text NOT NULL, data jsonb NOT NULL)"
        )
        conn.commit()
        # forget old keys, a bounded batch per start (a busy receiver would run
        # this on a timer instead)
        inbox.purge(conn, KEEP_KEYS)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(database_url, args.secret))
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
