"""The process's request slots, shared fairly by the claim loops of its databases.

Each :class:`Share` of a :class:`Budget` has a size (``concurrency`` divided among
the databases), may borrow idle slots but never another share's unused reserve,
and stops borrowing once a share below its size wants slots. Slots are taken
before a claim and the unused returned when it answers, so two loops never get
the same slot. Nothing here waits or does I/O.

Design: docs/explanation/design/budget.md
"""

from __future__ import annotations

from collections.abc import Callable

from outbox.errors import ConfigurationError

__all__ = ["Budget", "Share"]


class Share:
    """One claim loop's part of a :class:`Budget` (made by it)."""

    __slots__ = ("_budget", "in_use", "notify", "reserve", "size", "wanting")

    def __init__(self, budget: Budget, size: int) -> None:
        self._budget = budget
        self.size = size
        """Slots this share gets whenever it has the work for them."""
        self.reserve = max(1, size // 4)
        """Slots kept free for this share, while it does not use them, from the others."""
        self.in_use = 0
        """Slots taken: requests in flight, and the messages a running claim may bring."""
        self.wanting = False
        """Whether the claim loop waits for room (it has more work than slots)."""
        self.notify: Callable[[], None] = _nothing
        """Called when slots come back to the budget while this share wants some."""

    def free(self) -> int:
        """How many slots this share may take now."""
        return self._budget.free_for(self)

    def take(self, count: int) -> None:
        """Take ``count`` slots (for a claim of that many messages)."""
        self.in_use += count
        self._budget.in_use += count

    def give_back(self, count: int = 1) -> None:
        """Return ``count`` slots: a request ended, or a claim brought fewer messages."""
        if count <= 0:
            return
        self.in_use -= count
        self._budget.in_use -= count
        self._budget.returned(self)


class Budget:
    """``total`` request slots shared by ``members`` claim loops (see the module's
    docstring); :attr:`shares` are theirs, in order."""

    def __init__(self, total: int, members: int = 1) -> None:
        if members < 1:
            raise ConfigurationError("a budget needs at least one member")
        if total < members:
            raise ConfigurationError(
                f"concurrency: {total} is fewer than the {members} databases; each needs "
                "at least one request slot"
            )
        self.total = total
        self.in_use = 0
        size, extra = divmod(total, members)
        self.shares = tuple(Share(self, size + (1 if i < extra else 0)) for i in range(members))

    def free_for(self, share: Share) -> int:
        """The slots ``share`` may take now: those free, less the others' unused
        reserves, and none past its size while another below its own wants some."""
        free = self.total - self.in_use
        starved = False
        for other in self.shares:
            if other is share:
                continue
            free -= max(0, other.reserve - other.in_use)
            starved = starved or (other.wanting and other.in_use < other.size)
        if starved:
            free = min(free, share.size - share.in_use)
        return max(0, free)

    def returned(self, by: Share) -> None:
        """Slots came back: wake the other shares that wait for room (``by`` is
        woken by its own request's end already)."""
        for other in self.shares:
            if other is not by and other.wanting:
                other.notify()


def _nothing() -> None:
    return None
