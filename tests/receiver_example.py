"""``examples/webhook_receiver.py`` driven as a sender would drive it: started as
its own process, then sent signed requests over HTTP."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence

import httpx

from dispatchers.delivery.signing import webhook_headers

EVENT = b'{"type":"order.paid","timestamp":"2026-01-01T00:00:00Z","data":{"id":42}}'
WEBHOOK_ID = "evt-42:1"
"""The one event :func:`check_receiver_example` sends, and its webhook-id."""


def check_receiver_example(
    argv: Sequence[str],
    secret: str,
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run the receiver example with ``argv`` (it must print its URL first, so give
    it ``--port 0``) and check that it applies an event signed with ``secret``
    once, answers the same event again as a duplicate, and refuses a body the
    signature does not cover; the example is stopped before this returns."""
    server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, f"the receiver did not start: {line!r}"
        url = f"http://127.0.0.1:{match.group(1)}/hooks"
        headers = webhook_headers(
            [secret], msg_id=WEBHOOK_ID, timestamp=int(time.time()), body=EVENT
        )
        with httpx.Client(timeout=10) as client:
            answers = [client.post(url, content=EVENT, headers=headers) for _ in range(2)]
            forged = client.post(url, content=EVENT + b" ", headers=headers)
        assert [(a.status_code, a.text) for a in answers] == [(200, "applied"), (200, "duplicate")]
        assert forged.status_code == 401
    finally:
        server.terminate()
        server.communicate(timeout=10)
