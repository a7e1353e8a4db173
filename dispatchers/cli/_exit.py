"""The exit statuses of every ``outbox`` command, defined once.

A script or a supervisor reads them: 0 only when the command did what it was
asked. The README's "Exit statuses" table says the same for each command.
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What an ``outbox`` command's exit status means."""

    OK = 0
    """Done as asked (``dispatch --drain``: nothing is left due or running)."""

    FAILURE = 1
    """The database failed or refused the work: a database error; for
    ``dispatch``, a database it cannot use, a permanent error that persisted, a
    drain without progress; for ``status``, a lag above ``--max-lag``; for
    ``dead retry``/``purge``, an id that names no dead message; for a command
    that asks first, an answer other than yes."""

    USAGE = 2
    """The command line or its input was refused, or a needed extra is not
    installed; nothing was written."""

    DEAD_AFTER_DRAIN = 3
    """``dispatch --drain`` left nothing due or running, but some messages went
    dead during the drain (the summary line on stderr says how many)."""

    INTERRUPTED = 130
    """Interrupted by SIGINT (Ctrl-C) before it finished."""

    @classmethod
    def of_child(cls, status: int) -> ExitCode:
        """The status of a command that ran others (``dispatch --processes``) and
        exited as the first of them that failed: its member, or
        :attr:`FAILURE` for a status no command gives (a child killed by a
        signal, a crash)."""
        try:
            return cls(status)
        except ValueError:
            return cls.FAILURE
