"""What the runtime builds on of the library, beyond its public API.

The runtime (the ``dispatchers`` package: ``outbox dispatch``, ``outbox ui``,
the CLI and the bench) ships with the library, release for release, and needs
more of it than an application does: the statement loader, the checks a message
and an endpoint's fields pass, the plans that run in a caller's transaction.
Those live in the library's underscore modules, which may change without
notice; the runtime reaches them only through the names below (an import
contract in ``pyproject.toml`` holds it to that), so that what the two share is
one list, read in one place. Applications use :mod:`outbox`,
:mod:`outbox.admin` and :mod:`outbox.receiver` instead: nothing here is
promised to them.
"""

# the checks and bounds of arguments, messages and endpoint fields: the CLI, the
# dashboard and the bench check their input by the library's own rules
from outbox._arguments import MAX_ID
from outbox._endpoint_auth import MAX_CREDENTIAL, Auth, parse_auth
from outbox._endpoint_fields import (
    MAX_DESCRIPTION,
    MAX_METADATA_BYTES,
    check_metadata,
    check_tenant_id,
)
from outbox._endpoint_rows import EndpointRow, json_value
from outbox._endpoint_tls import MAX_PEM, load_client_cert, pem_digest

# the marker that erased bodies keep (outbox expunge, retention rules)
from outbox._expunge import EXPUNGED_BODY
from outbox._filters import MAX_FILTER_LENGTH, check_filter
from outbox._inspect import DestinationHealth
from outbox._message import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_ATTEMPTS_LIMIT,
    MAX_KEY_LENGTH,
    MAX_URL_LENGTH,
    build_message,
    check_key,
    check_url,
    encode_body,
    ipv4_host_problem,
)
from outbox._policy_fields import MAX_BURST, MAX_RATE_LIMIT, MIN_RATE_LIMIT

# statements: the loader, a schema's catalogs, the advisory lock keys
from outbox._queries import (
    DUTY_LOCK_CLASS,
    Queries,
    Statement,
    catalog,
    check_schema_name,
    lock_object_id,
    queries_for,
)
from outbox._storable import check_text

# plans run in the caller's transaction (psycopg or SQLAlchemy)
from outbox._transaction import rows_plan, run_sync, scalar

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DUTY_LOCK_CLASS",
    "EXPUNGED_BODY",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_BURST",
    "MAX_CREDENTIAL",
    "MAX_DESCRIPTION",
    "MAX_FILTER_LENGTH",
    "MAX_ID",
    "MAX_KEY_LENGTH",
    "MAX_METADATA_BYTES",
    "MAX_PEM",
    "MAX_RATE_LIMIT",
    "MAX_URL_LENGTH",
    "MIN_RATE_LIMIT",
    "Auth",
    "DestinationHealth",
    "EndpointRow",
    "Queries",
    "Statement",
    "build_message",
    "catalog",
    "check_filter",
    "check_key",
    "check_metadata",
    "check_schema_name",
    "check_tenant_id",
    "check_text",
    "check_url",
    "encode_body",
    "ipv4_host_problem",
    "json_value",
    "load_client_cert",
    "lock_object_id",
    "parse_auth",
    "pem_digest",
    "queries_for",
    "rows_plan",
    "run_sync",
    "scalar",
]
