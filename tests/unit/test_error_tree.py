"""The error tree drawn in ``outbox.errors`` is the tree of classes the project defines."""

from __future__ import annotations

import importlib
import pkgutil
import re

import dispatchers
import outbox
from outbox.errors import OutboxError


def _every_subclass(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_every_subclass(sub)}
    return found


def test_the_docstring_draws_every_error_class_and_no_other() -> None:
    for package in (outbox, dispatchers):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            # the bench's modules need its extra; a __main__ runs its command
            if not module.name.startswith("dispatchers.bench") and not module.name.endswith(
                ".__main__"
            ):
                importlib.import_module(module.name)
    defined = {cls.__name__ for cls in _every_subclass(OutboxError)} | {"OutboxError"}
    doc = importlib.import_module("outbox.errors").__doc__ or ""
    tree = doc.split("The tree::")[1]
    # a class name, then at least two spaces before its description
    drawn = set(re.findall(r"^[ │]*(?:[├└]── )?([A-Z]\w+) {2,}", tree, re.M))
    assert drawn == defined


def test_a_bad_message_is_a_bad_argument_but_not_the_reverse() -> None:
    assert issubclass(outbox.InvalidMessage, outbox.InvalidArgument)
    assert issubclass(outbox.InvalidArgument, ValueError)
    assert not issubclass(outbox.InvalidArgument, outbox.InvalidMessage)
