"""Server-rendered charts: deliveries and failures per minute or hour as inline SVG.

Pure functions of rows already read, so they are tested without a database or a
browser, and the page needs no charting script. The SVG holds only numbers and
fixed labels of ours, never a value from the database, so it is safe to insert
unescaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from markupsafe import Markup

WIDTH = 720
HEIGHT = 160
_TOP = 10
_BOTTOM = 22  # room for the time labels
_LEFT = 36  # room for the scale


class Bucket(NamedTuple):
    """Attempts that started in one minute (or one hour: ``minute`` is its start)."""

    minute: datetime
    delivered: int
    failed: int


def per_minute(
    rows: Iterable[tuple[datetime, int, int]], *, now: datetime, minutes: int = 60
) -> list[Bucket]:
    """One bucket for each of the last ``minutes`` minutes up to ``now``'s, oldest
    first, zero where no row is: the query returns only minutes with attempts."""
    end = now.replace(second=0, microsecond=0)
    return _filled(rows, end=end, step=timedelta(minutes=1), count=minutes)


def per_hour(
    rows: Iterable[tuple[datetime, int, int]], *, now: datetime, hours: int = 24
) -> list[Bucket]:
    """One bucket for each of the last ``hours`` hours up to ``now``'s, as
    :func:`per_minute` does for minutes."""
    end = now.replace(minute=0, second=0, microsecond=0)
    return _filled(rows, end=end, step=timedelta(hours=1), count=hours)


def _filled(
    rows: Iterable[tuple[datetime, int, int]], *, end: datetime, step: timedelta, count: int
) -> list[Bucket]:
    counts = {start: (delivered, failed) for start, delivered, failed in rows}
    buckets = []
    for i in range(count - 1, -1, -1):
        start = end - i * step
        delivered, failed = counts.get(start, (0, 0))
        buckets.append(Bucket(start, delivered, failed))
    return buckets


def _scale_top(peak: int) -> int:
    """The top of the scale: ``peak`` rounded up to 1, 2 or 5 times a power of ten."""
    top = 1
    while True:
        for step in (1, 2, 5):
            if top * step >= peak:
                return top * step
        top *= 10


def scale_ticks(top: int) -> list[int]:
    """The values the scale labels, from 0 up to ``top`` (1, 2 or 5 times a power
    of ten): five or four even steps, each a round number (1, 2 or 5 times a
    power of ten, and whole), else fewer."""
    for parts in (5, 4, 2, 1):
        step, rest = divmod(top, parts)
        if rest == 0 and str(step).rstrip("0") in ("1", "2", "5"):
            return [step * i for i in range(parts + 1)]
    return [0, top]


def bars(
    buckets: Sequence[Bucket],
    *,
    label: str = "Deliveries and failures per minute, last hour",
    tick_every: int = 15,
) -> Markup:
    """Stacked bars, one per bucket: deliveries, and failures on top of them; a
    time label under every ``tick_every``-th bucket and the latest. ``label`` is
    our own text, never a value from the database."""
    top = _scale_top(max((b.delivered + b.failed for b in buckets), default=0))
    plot_w = WIDTH - _LEFT
    plot_h = HEIGHT - _TOP - _BOTTOM
    slot = plot_w / max(len(buckets), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{label}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{WIDTH}" y2="{_TOP + plot_h}"/>',
    ]
    for tick in scale_ticks(top):
        y = _TOP + plot_h - plot_h * tick / top
        if tick:
            parts.append(
                f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{WIDTH}" y2="{y:.1f}"/>'
            )
        parts.append(
            f'<text class="scale" x="{_LEFT - 4}" y="{y + 3.5:.1f}" text-anchor="end">{tick}</text>'
        )
    for i, bucket in enumerate(buckets):
        x = _LEFT + i * slot + 1
        base: float = _TOP + plot_h
        for kind, count in (("delivered", bucket.delivered), ("failed", bucket.failed)):
            if count:
                height = plot_h * count / top
                base -= height
                parts.append(
                    f'<rect class="{kind}" x="{x:.1f}" y="{base:.1f}" '
                    f'width="{max(slot - 2, 1):.1f}" height="{height:.1f}">'
                    f"<title>{bucket.minute:%H:%M} {kind} {count}</title></rect>"
                )
        if i == len(buckets) - 1:  # the latest minute, flush with the right edge
            parts.append(
                f'<text class="time" x="{WIDTH - 2}" y="{HEIGHT - 6}" text-anchor="end">'
                f"{bucket.minute:%H:%M}</text>"
            )
        elif i % tick_every == 0:
            parts.append(
                f'<text class="time" x="{x:.1f}" y="{HEIGHT - 6}">{bucket.minute:%H:%M}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (numbers and our own labels only)
