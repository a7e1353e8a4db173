"""An orders service in Django, in one file: a view creates an order and
publishes ``order.created`` in the same transaction.

    python examples/django_orders.py --database-url postgresql://app@localhost/shop \
        --webhook-url https://partner.example.com/hooks

Without --database-url (or $OUTBOX_DATABASE_URL) it uses the embedded server in
./.outbox/pg, as every outbox command does. Run `outbox migrate` first.

It subscribes the webhook URL to ``order.created``, then posts one order to the
view through Django's test client (URL routing, middleware and view, as a real
request takes them). `outbox dispatch` sends the event once the view's
transaction commits; had the view failed, there would be neither an order nor an
event. In a project, the model, view and URL go in an app as usual; only the
``publish`` call is the outbox's.
"""

from __future__ import annotations

import argparse
import json

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

import outbox
from dispatchers.embedded import resolve

box = outbox.Outbox()


def configure(database_url: str) -> None:
    """Settings of a minimal project: Django's PostgreSQL backend (psycopg 3) on
    the outbox's database, and this module as the URL configuration."""
    info = conninfo_to_dict(database_url)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": info["dbname"],
                "HOST": info.get("host", ""),  # a Unix socket directory works too
                "PORT": info.get("port", ""),
                "USER": info.get("user", ""),
                "PASSWORD": info.get("password", ""),
            }
        },
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["testserver", "localhost"],
        USE_TZ=True,
    )
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, else the "
        "embedded server in ./.outbox/pg, as for every outbox command)",
    )
    parser.add_argument(
        "--webhook-url", required=True, help="where the order.created webhook is sent"
    )
    args = parser.parse_args()
    configure(resolve(args.database_url).url)

    # Models, views and URLs can only be declared once Django is set up.
    from django.db import connection, models, transaction
    from django.http import HttpRequest, JsonResponse
    from django.test import Client
    from django.urls import path
    from django.views.decorators.http import require_POST

    class Order(models.Model):
        customer = models.CharField(max_length=200)
        total_cents = models.IntegerField()

        class Meta:
            app_label = "shop"
            db_table = "shop_orders"

    @require_POST
    @transaction.atomic
    def create_order(request: HttpRequest) -> JsonResponse:
        """Create the order and publish its event in the request's transaction."""
        data = json.loads(request.body)
        order = Order.objects.create(customer=data["customer"], total_cents=data["total_cents"])
        box.publish(
            connection,
            "order.created",
            {"order_id": order.id, "total_cents": order.total_cents},
            idempotency_key=f"order-{order.id}-created",  # stable: a retried view publishes once
        )
        return JsonResponse({"id": order.id}, status=201)

    urlpatterns.append(path("orders", create_order))

    with transaction.atomic():
        if Order._meta.db_table not in connection.introspection.table_names():
            with connection.schema_editor() as editor:
                editor.create_model(Order)
        outbox.Endpoints().add(connection, url=args.webhook_url, event_types=["order.created"])

    response = Client().post(
        "/orders", {"customer": "ada", "total_cents": 4200}, content_type="application/json"
    )
    order_id = response.json()["id"]
    print(f"order {order_id} created; order.created published in the same transaction")


urlpatterns: list[object] = []
"""This module's URLs (it is the project's ROOT_URLCONF), filled in by main()."""

if __name__ == "__main__":
    main()
