"""The bench receiver (:mod:`dispatchers.bench.receiver`) in a child process.

The receiver runs as a script of its own in a fresh interpreter (``python -I``:
the standard library only), so its CPU time is its own and a benchmark reads it
from ``/proc``; this module starts it, asks it for its counts and arrival times
over HTTP, and always ends it.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from dispatchers.bench import receiver
from dispatchers.bench.receiver import HOST, Replies


class ReceiverProcess:
    """Runs the bench receiver in a child process; a context manager.

    ``port`` and ``url`` are known once entered, and with ``ports`` above 1,
    ``urls``: one per port, each its own destination to a dispatcher; :meth:`counts`
    and :meth:`arrivals` ask the running receiver; :meth:`stop` sends SIGTERM and
    returns the final counts. Leaving the block always ends the process.
    ``replies`` delays answers or gives some a big body (see :class:`Replies`).
    """

    def __init__(
        self,
        *,
        record_keys: bool = True,
        start_timeout: float = 15.0,
        replies: Replies | None = None,
        ports: int = 1,
    ) -> None:
        self.record_keys = record_keys
        self.replies = replies or Replies()
        self.start_timeout = start_timeout
        self.ports = ports
        self.port = 0
        self.listening: list[int] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="outbox-receiver-")

    @property
    def pid(self) -> int:
        return self._started().pid

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/hook"

    @property
    def urls(self) -> list[str]:
        """The URL of every port: as many destinations as ``ports``."""
        return [f"http://{HOST}:{port}/hook" for port in self.listening]

    def __enter__(self) -> ReceiverProcess:
        try:
            self.start()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()

    def start(self) -> None:
        ready = Path(self._dir.name) / "port"
        command = [
            sys.executable,
            "-I",  # standard library only: nothing from the caller's path or environment
            str(Path(receiver.__file__).resolve()),
            "--port",
            "0",
            "--ports",
            str(self.ports),
            "--ready-file",
            str(ready),
            "--stats-file",
            str(Path(self._dir.name) / "stats.json"),
            "--record-keys" if self.record_keys else "--no-record-keys",
            "--delay",
            repr(self.replies.delay),
            "--big-response-share",
            repr(self.replies.big_share),
            "--big-response-bytes",
            str(self.replies.big_size),
            "--delay-share",
            repr(self.replies.delay_share),
            "--fail-share",
            repr(self.replies.fail_share),
        ]
        # our own interpreter and file, with fixed arguments
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # noqa: S603
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"receiver exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"receiver not ready within {self.start_timeout:g} s")
            time.sleep(0.01)
        self.listening = [int(port) for port in ready.read_text().split()]
        self.port = self.listening[0]

    def _get(self, path: str, timeout: float = 30.0) -> Any:
        self._started()
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"receiver answered {response.status} to {path}")
            return json.loads(body)
        finally:
            conn.close()

    def counts(self) -> dict[str, Any]:
        """The counts so far (``requests``, ``distinct_keys``, ``duplicates``, ...)."""
        result: dict[str, Any] = self._get("/_bench/counts")
        return result

    def arrivals(self, prefix: str, *, since: float = 0.0) -> dict[str, float]:
        """The first arrival time (``time.time()``) of every key starting with
        ``prefix``, of those that arrived at ``since`` or later."""
        path = f"/_bench/arrivals?prefix={quote(prefix)}&since={since!r}"
        result: dict[str, float] = self._get(path)
        return result

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """SIGTERM the receiver, wait for it, and return its counts."""
        process = self._started()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout)
        stats = Path(self._dir.name) / "stats.json"
        if not stats.exists():
            raise RuntimeError(f"receiver exited with {process.returncode}, no counts")
        result: dict[str, Any] = json.loads(stats.read_text())
        return result

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError("receiver not started")
        return self.process

    def kill(self) -> None:
        """End the process if it still runs (SIGTERM, then SIGKILL), and clean up."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5.0)
        self._dir.cleanup()
