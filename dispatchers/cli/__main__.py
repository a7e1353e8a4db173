"""``python -m dispatchers.cli``: the ``outbox`` command, as the supervisor starts
its children."""

import sys

from dispatchers.cli import main

sys.exit(main())
