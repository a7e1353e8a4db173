"""The TLS options of ``outbox endpoints add`` and ``update``: a CA bundle, a
client certificate and its key, each read from a PEM file.

The files are read here (:func:`pem_texts`, through
:func:`~dispatchers.cli._common.read_small_file`: a regular file of ASCII text,
at most :data:`~outbox._endpoint_tls.MAX_PEM` bytes) and checked by
:mod:`outbox._endpoint_tls` before anything is written; a file that cannot be
read, or refused material, is a usage error naming its option. Only digests of
the PEM texts are ever shown, and of the key only how it is stored.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from dispatchers.cli._common import UsageError, read_small_file
from outbox.errors import InvalidArgument
from outbox.internal import MAX_PEM

_TLS_OPTIONS = {
    "ca_bundle": "--ca-bundle",
    "clear_ca_bundle": "--no-ca-bundle",
    "client_cert": "--client-cert",
    "client_key": "--client-key",
    "clear_client_cert": "--no-client-cert",
}
"""The option that gives each TLS argument of an endpoint."""


_FILES = ("ca_bundle", "client_cert", "client_key")
"""The TLS options that name a PEM file (their destinations)."""


def pem_texts(args: argparse.Namespace) -> dict[str, str | None]:
    """The PEM text of each TLS file option given (checked by
    :mod:`outbox._endpoint_tls`), None for those not given."""
    return {
        name: None
        if (path := getattr(args, name)) is None
        else read_small_file(path, _TLS_OPTIONS[name], limit=MAX_PEM, encoding="ascii")
        for name in _FILES
    }


@contextmanager
def naming_tls_options() -> Iterator[None]:
    """Refused TLS material is a usage error naming the option that gave it."""
    try:
        yield
    except InvalidArgument as exc:
        if exc.field not in _TLS_OPTIONS:
            raise
        raise UsageError(f"{_TLS_OPTIONS[exc.field]}: {exc.problem}") from None


def add_tls_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    """The options of ``add`` (and, with ``update``, of ``update``) that set TLS material."""
    p.add_argument(
        "--ca-bundle",
        metavar="FILE",
        help="PEM certificates its deliveries verify against, instead of the system's roots",
    )
    p.add_argument(
        "--client-cert",
        metavar="FILE",
        help="PEM client certificate (and chain) its deliveries present; with --client-key",
    )
    p.add_argument(
        "--client-key",
        metavar="FILE",
        help="the client certificate's unencrypted PEM private key, sealed at rest "
        "with a key configured",
    )
    if update:
        p.add_argument(
            "--no-ca-bundle", action="store_true", help="verify against the system's roots again"
        )
        p.add_argument(
            "--no-client-cert", action="store_true", help="remove the client certificate and key"
        )
