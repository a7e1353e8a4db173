"""A valid message is stored as given and sent byte for byte as stored (a property
test against real PostgreSQL and a raw HTTP server on 127.0.0.1).

Each example enqueues a few generated messages (method, headers, body bytes,
content type) in one transaction, reads them back, drains them with a dispatcher
and parses the requests exactly as they arrived on the socket.
"""

from __future__ import annotations

import asyncio
import socket
import string
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import Outbox
from outbox._message import METHODS, RESERVED_HEADERS
from tests.database import Db
from tests.dispatching import drain, fast_config
from tests.rawserver import RawServer, read_message

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
TOKEN = "!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits
VISIBLE = "".join(chr(c) for c in range(0x21, 0x7F))

# Header values may hold spaces and tabs, but not at either end: HTTP strips the
# whitespace around a field value (RFC 9110, 5.5), so no sender can keep it.
header_values = st.text(VISIBLE + " \t", max_size=60).filter(lambda v: v == v.strip(" \t"))
# Names the dispatcher sets itself when the message does not: a message's own wins.
overridable = st.sampled_from(["User-Agent", "user-agent", "Accept-Encoding", "ACCEPT", "Accept"])
header_names = st.one_of(overridable, st.text(TOKEN, min_size=1, max_size=20)).filter(
    lambda name: name.lower() not in RESERVED_HEADERS and not name.lower().startswith("webhook-")
)
media_types = st.builds(
    lambda kind, sub, parameters: f"{kind}/{sub}{parameters}",
    st.text(TOKEN, min_size=1, max_size=12),
    st.text(TOKEN, min_size=1, max_size=12),
    st.sampled_from(["", "; charset=utf-8", ';  boundary="a b"', ";q=1"]),
)


PATIENT = {"request_timeout": 10.0, "connect_timeout": 5.0, "lease": 30.0}
"""Each message must be sent once, within one drain, however loaded the machine:
an attempt cut short would be retried after the drain has ended."""


@dataclass(frozen=True)
class Message:
    method: str
    headers: dict[str, str]
    body: bytes
    content_type: str | None


messages = st.builds(
    Message,
    method=st.sampled_from(sorted(METHODS)),
    headers=st.lists(
        st.tuples(header_names, header_values), max_size=6, unique_by=lambda h: h[0].lower()
    ).map(dict),
    body=st.binary(max_size=2048),
    content_type=st.none() | media_types,
)


@dataclass(frozen=True)
class Arrived:
    method: str
    headers: list[tuple[str, str]]  # in order, names as sent
    body: bytes

    def values(self, name: str) -> list[str]:
        return [value for sent, value in self.headers if sent.lower() == name.lower()]


class Recorder:
    """Answers 200 to every request and keeps each one as it arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived: list[Arrived] = []

    def __call__(self, conn: socket.socket, closed: threading.Event) -> None:
        while not closed.is_set():
            head, body = read_message(conn)
            if not head:
                return
            request_line, *lines = head.decode("latin-1").split("\r\n")
            headers = []
            for line in lines:
                name, _, value = line.partition(":")
                headers.append((name, value.strip(" \t")))
            with self.lock:
                self.arrived.append(Arrived(request_line.split(" ")[0], headers, body))
            conn.sendall(OK)

    def by_key(self) -> dict[str, Arrived]:
        with self.lock:
            return {request.values("idempotency-key")[0]: request for request in self.arrived}


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, RawServer]]:
    recorder = Recorder()
    with RawServer(recorder) as server:
        yield recorder, server


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
@settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(messages, min_size=1, max_size=4))
@pytest.mark.slow
def test_a_valid_message_is_stored_and_sent_byte_for_byte(
    database_url: str,
    recorder: tuple[Recorder, RawServer],
    http_client: str,
    batch: list[Message],
) -> None:
    received, server = recorder
    box = Outbox()
    sent: dict[str, tuple[int, Message]] = {}
    with psycopg.connect(database_url) as conn:
        for message in batch:
            key = uuid.uuid4().hex
            message_id = box.enqueue(
                conn,
                url=server.url(),
                idempotency_key=key,
                method=message.method,
                headers=message.headers,
                body=message.body,
                content_type=message.content_type,
            )
            sent[key] = (message_id, message)
    content_type: dict[str, str] = {}
    for key, (message_id, message) in sent.items():
        ((method, headers, body, stored_type),) = Db(database_url).query(
            "SELECT method, headers, body, content_type FROM outbox.messages WHERE id = %s",
            message_id,
        )
        assert (method, headers, bytes(body)) == (message.method, message.headers, message.body)
        assert stored_type == (message.content_type or "application/octet-stream")
        content_type[key] = stored_type

    asyncio.run(drain(Db(database_url), fast_config(PATIENT, http_client=http_client)))

    arrived = received.by_key()
    for key, (_, message) in sent.items():
        request = arrived.get(f'"{key}"')
        assert request is not None, f"{message} was not sent"
        assert request.method == message.method
        assert request.body == message.body
        assert request.values("content-type") == [content_type[key]]
        for name, value in message.headers.items():
            assert request.values(name) == [value], name
        names = [name.lower() for name, _ in request.headers]
        assert len(names) == len(set(names)), f"a header sent twice: {request.headers}"
