"""A fast HTTP/1.1 receiver for benchmarks: 200 to everything, counted.

It listens on 127.0.0.1 only, records each ``Idempotency-Key``'s first arrival,
and can answer late, fail or answer huge for an exact share of requests;
``/_bench/...`` requests are its own and not counted. It exits on SIGTERM, after
``--max-seconds`` or when its parent goes away.

The module stays whole: it runs as a script in a fresh interpreter (``python
-I``), so it can import nothing but the standard library, not even its siblings.

Design: docs/explanation/design/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

HOST = "127.0.0.1"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
OK_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
CONTROL = b"/_bench/"
BIG_RESPONSE_BYTES = 50_000_000
BLOCK = b"b" * (64 * 1024)
"""Every big body is written from this one block."""


def _error(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass
class Counts:
    requests: int = 0
    distinct_keys: int = 0
    duplicates: int = 0
    without_key: int = 0
    connections: int = 0
    open_connections: int = 0
    most_open_connections: int = 0
    bad_requests: int = 0
    failed: int = 0
    """Counted requests answered 500 (their keys are not recorded)."""
    delayed: int = 0
    """Counted requests answered ``--delay`` seconds late."""
    big_responses: int = 0
    big_bytes_sent: int = 0
    """Bytes of big bodies handed to the socket (the client may have read fewer)."""
    # key -> first arrival (time.time())
    keys: dict[bytes, float] = field(default_factory=dict, repr=False)

    def report(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        data = asdict(self)
        del data["keys"]
        data["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 4)
        return data

    def arrivals(self, prefix: str, since: float = 0.0) -> dict[str, float]:
        """First arrival of every key starting with ``prefix`` (keys unquoted), of
        those that arrived at ``since`` or later."""
        wanted = prefix.encode()
        found: dict[str, float] = {}
        for raw, at in self.keys.items():
            key = raw[1:-1] if raw[:1] == b'"' and raw[-1:] == b'"' else raw
            if at >= since and key.startswith(wanted):
                found[key.decode("ascii", "replace")] = at
        return found


def _picked(number: int, share: float, phase: float = 0.0) -> bool:
    """Whether the ``number``-th counted request (from 1) is among a ``share`` of
    them: whenever ``number * share + phase`` reaches the next whole number."""
    return bool(share) and int(number * share + phase) > int((number - 1) * share + phase)


@dataclass(frozen=True)
class Replies:
    """How counted requests are answered: a ``fail_share`` of them (0 for none) with
    ``500`` at once; a ``delay_share`` of the others (all by default) after
    ``delay`` seconds (0: at once); and a ``big_share`` of them (0 for none) with a
    body ``big_size`` bytes long."""

    delay: float = 0.0
    big_share: float = 0.0
    big_size: int = BIG_RESPONSE_BYTES
    delay_share: float = 1.0
    fail_share: float = 0.0

    def big(self, number: int) -> bool:
        return _picked(number, self.big_share)

    def failed(self, number: int) -> bool:
        return _picked(number, self.fail_share)

    def delayed(self, number: int) -> bool:
        return bool(self.delay) and _picked(number, self.delay_share, phase=0.5)


def _ok(length: int, close: bool) -> bytes:
    if not length:
        return OK_CLOSE if close else OK
    return (
        b"HTTP/1.1 200 OK\r\nContent-Length: "
        + str(length).encode()
        + (b"\r\nConnection: close" if close else b"")
        + b"\r\n\r\n"
    )


class _Connection(asyncio.Protocol):
    """One client connection: parses requests out of a buffer and answers in order.

    An answer that is delayed or has a big body is *held*: reading pauses and the
    rest of the buffer waits until it is out, which keeps pipelined answers in
    order. A big body is written a block at a time, only while the transport
    wants more (``pause_writing``/``resume_writing``), ``unsent`` bytes to go."""

    def __init__(self, counts: Counts, record_keys: bool, replies: Replies) -> None:
        self.counts = counts
        self.record_keys = record_keys
        self.replies = replies
        self.buffer = bytearray()
        self.transport = cast(asyncio.Transport, None)
        self.held = False
        self.unsent = 0
        self.close_after = False
        self.writable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        counts = self.counts
        counts.connections += 1
        counts.open_connections += 1
        counts.most_open_connections = max(counts.most_open_connections, counts.open_connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts.open_connections -= 1

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self._pump()

    def _answer(self, length: int) -> None:
        """Send the held answer, with a body of ``length`` bytes."""
        if self.transport.is_closing():
            return
        self.transport.write(_ok(length, self.close_after))
        self.unsent = length
        self._pump()

    def _pump(self) -> None:
        """Write the body while the transport takes it; once it is all written, go
        on with the requests that waited."""
        # a failed send closes the transport at once but reports the loss later
        while self.unsent and self.writable and not self.transport.is_closing():
            size = min(self.unsent, len(BLOCK))
            self.transport.write(BLOCK if size == len(BLOCK) else BLOCK[:size])
            self.unsent -= size
            self.counts.big_bytes_sent += size
        if self.unsent or self.transport.is_closing():
            return
        self.held = False
        if self.close_after:
            self.transport.close()
            return
        self.transport.resume_reading()
        if self.buffer:
            self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if self.held:
            return  # reading resumes once the held answer is out
        out: list[bytes] = []
        pos = 0
        close = False
        big = delayed = False
        now = time.time()
        while True:
            end = buffer.find(b"\r\n\r\n", pos)
            if end < 0:
                if len(buffer) - pos > MAX_HEAD_BYTES:
                    out.append(_error(b"431 Request Header Fields Too Large"))
                    self.counts.bad_requests += 1
                    close = True
                break
            head = bytes(buffer[pos:end]).split(b"\r\n")
            parsed = self._parse(head)
            if parsed is None:
                out.append(_error(b"400 Bad Request"))
                self.counts.bad_requests += 1
                close = True
                break
            target, length, key, keep_alive, chunked = parsed
            if chunked:
                out.append(_error(b"501 Not Implemented"))
                self.counts.bad_requests += 1
                close = True
                break
            if length > MAX_BODY_BYTES:
                out.append(_error(b"413 Content Too Large"))
                self.counts.bad_requests += 1
                close = True
                break
            total = end + 4 + length
            if len(buffer) < total:
                break  # the body is still arriving
            pos = total
            if target.startswith(CONTROL):
                out.append(self._control(target))
                continue
            number = self.counts.requests + 1
            if self.replies.failed(number):
                self.counts.requests = number
                self.counts.failed += 1
                if not keep_alive:
                    out.append(_error(b"500 Internal Server Error"))
                    close = True
                    break
                out.append(FAIL)
                continue
            self._count(key, now)
            big = self.replies.big(number)
            delayed = self.replies.delayed(number)
            if big or delayed:
                self.held = True
                self.close_after = not keep_alive
                if big:
                    self.counts.big_responses += 1
                if delayed:
                    self.counts.delayed += 1
                break
            if not keep_alive:
                out.append(OK_CLOSE)
                close = True
                break
            out.append(OK)
        del buffer[:pos]
        if out:
            self.transport.write(b"".join(out))
        if self.held:
            self.transport.pause_reading()
            length = self.replies.big_size if big else 0
            if delayed:
                asyncio.get_running_loop().call_later(self.replies.delay, self._answer, length)
            else:
                self._answer(length)
        elif close:
            self.transport.close()

    def _parse(self, head: list[bytes]) -> tuple[bytes, int, bytes | None, bool, bool] | None:
        """(target, content length, idempotency key, keep alive, chunked), or None if
        malformed."""
        parts = head[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return None
        keep_alive = parts[2] != b"HTTP/1.0"
        length = 0
        key: bytes | None = None
        chunked = False
        for line in head[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                return None
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return None
                if length < 0:
                    return None
            elif name == b"idempotency-key":
                key = value.strip()
            elif name == b"connection":
                token = value.strip().lower()
                if token == b"close":
                    keep_alive = False
                elif token == b"keep-alive":
                    keep_alive = True
            elif name == b"transfer-encoding":
                chunked = True
        return parts[1], length, key, keep_alive, chunked

    def _count(self, key: bytes | None, now: float) -> None:
        counts = self.counts
        counts.requests += 1
        if key is None:
            counts.without_key += 1
        elif self.record_keys:
            if key in counts.keys:
                counts.duplicates += 1
            else:
                counts.keys[key] = now
                counts.distinct_keys += 1

    def _control(self, target: bytes) -> bytes:
        """The answer to one of the benchmark's own requests."""
        parts = urlsplit(target.decode("ascii", "replace"))
        data: Any
        if parts.path == "/_bench/counts":
            data = self.counts.report()
        elif parts.path == "/_bench/arrivals":
            query = parse_qs(parts.query)
            data = self.counts.arrivals(
                query.get("prefix", [""])[0], float(query.get("since", ["0"])[0])
            )
        else:
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        body = json.dumps(data, separators=(",", ":")).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def serve(
    *,
    port: int,
    ready_file: Path | None,
    record_keys: bool,
    max_seconds: float,
    replies: Replies | None = None,
    ports: int = 1,
) -> Counts:
    """Serve on ``ports`` ports (``port`` first) until SIGTERM/SIGINT,
    ``max_seconds``, or the parent's exit."""
    loop = asyncio.get_running_loop()
    counts = Counts()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    async with contextlib.AsyncExitStack() as servers:
        bound: list[int] = []
        for n in range(ports):
            server = await loop.create_server(
                lambda: _Connection(counts, record_keys, replies or Replies()),
                HOST,
                port if n == 0 else 0,
                backlog=1024,
            )
            await servers.enter_async_context(server)
            bound.append(server.sockets[0].getsockname()[1])
        listening = " ".join(map(str, bound))
        if ready_file is not None:
            _write_atomically(ready_file, f"{listening}\n")
        else:
            print(listening, flush=True)
        deadline = loop.time() + max_seconds
        while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(1.0, deadline - loop.time()))
    return counts


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument(
        "--ports", type=int, default=1, help="listen on this many ports, --port first (default 1)"
    )
    parser.add_argument(
        "--ready-file", type=Path, help="write the ports here once listening, space-separated"
    )
    parser.add_argument("--stats-file", type=Path, help="write the counts here (default stdout)")
    parser.add_argument(
        "--record-keys",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="remember Idempotency-Key values to count duplicates (default: on)",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=3600.0, help="exit after this long (default 3600)"
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="answer each counted request this long after it arrived (default 0)",
    )
    parser.add_argument(
        "--delay-share",
        type=_share,
        default=1.0,
        metavar="FRACTION",
        help="delay only this share of the counted requests, 0 to 1 (default 1: all)",
    )
    parser.add_argument(
        "--fail-share",
        type=_share,
        default=0.0,
        metavar="FRACTION",
        help="answer this share of the counted requests 500 at once (default 0: none)",
    )
    parser.add_argument(
        "--big-response-share",
        type=_share,
        default=0.0,
        metavar="FRACTION",
        help="answer this share of the counted requests (0 to 1) with a big body (default 0: none)",
    )
    parser.add_argument(
        "--big-response-bytes",
        type=int,
        default=BIG_RESPONSE_BYTES,
        metavar="N",
        help=f"length of a big body (default {BIG_RESPONSE_BYTES:,})",
    )
    args = parser.parse_args(argv)
    if args.big_response_bytes < 0:
        parser.error("--big-response-bytes must be at least 0")
    if not 1 <= args.ports <= 1000:
        parser.error("--ports must be from 1 to 1000")
    if not 0 <= args.delay < 3600:
        parser.error("--delay must be at least 0 and below 3600")
    counts = asyncio.run(
        serve(
            port=args.port,
            ports=args.ports,
            ready_file=args.ready_file,
            record_keys=args.record_keys,
            max_seconds=args.max_seconds,
            replies=Replies(
                args.delay,
                args.big_response_share,
                args.big_response_bytes,
                delay_share=args.delay_share,
                fail_share=args.fail_share,
            ),
        )
    )
    text = json.dumps(counts.report())
    if args.stats_file is not None:
        _write_atomically(args.stats_file, text + "\n")
    else:
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
