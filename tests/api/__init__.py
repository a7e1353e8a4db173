"""The management API served on 127.0.0.1 for a test's database, and a client
that sends one token's requests and reads JSON or problem details back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatchers.api.store import create_token
from dispatchers.api.tokens import Scope
from tests.dashboard import Ui, running

PREFIX = "/api/v1"


def make_token(
    database_url: str, scope: Scope = "write", *, tenant: str | None = None, name: str = ""
) -> str:
    """A new token of the test's database, as ``outbox api-tokens create`` makes it."""
    with psycopg.connect(database_url) as conn:
        return create_token(conn, "outbox", scope=scope, name=name, tenant=tenant)[1]


@dataclass
class Answer:
    """A response: its status, content type, headers and decoded JSON body."""

    status: int
    content_type: str
    headers: dict[str, str]
    body: Any

    @property
    def problem(self) -> dict[str, Any]:
        """The problem details of a refusal (checking that it is one)."""
        assert self.content_type == "application/problem+json", (self.status, self.body)
        assert isinstance(self.body, dict) and self.body["status"] == self.status, self.body
        return self.body


@dataclass
class Client:
    """Requests to the API of a running dashboard, with one token."""

    ui: Ui
    token: str | None

    async def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        given = token if token is not None else self.token
        if given is not None:
            sent.setdefault("Authorization", f"Bearer {given}")
        async with self.ui.http.request(
            method,
            self.ui.url + PREFIX + path,
            json=json_body,
            params=params,
            headers=sent,
            data=data,
        ) as response:
            text = await response.text()
            body = json.loads(text) if text else None
            return Answer(response.status, response.content_type, dict(response.headers), body)

    def as_token(self, token: str) -> Client:
        return Client(self.ui, token)


@contextlib.asynccontextmanager
async def serving_api(database_url: str, **kwargs: Any) -> AsyncIterator[Client]:
    """The dashboard (and so the API) of ``database_url`` on 127.0.0.1, with a
    client holding a new operator token of the write scope."""
    token = make_token(database_url, "write", name="test operator")
    async with running(database_url, **kwargs) as ui:
        yield Client(ui, token)
