"""An explicit-state model of the delivery protocol, checked exhaustively.

The rows the protocol's statements read and write (messages, concurrency slots,
a destination's health row), the producers' transactions with their ordering-key
locks, the dispatchers' in-memory flights and a deduping receiver, as immutable
tuples (:mod:`tests.model.state`); every statement of ``sql/queries/*.sql`` and
``dispatchers/store/sql/*.sql`` that changes them, and the faults around them,
as one atomic action each (:mod:`tests.model.protocol`); the properties of the
delivery contract, as ``docs/explanation/delivery-contract.md`` states it
(:mod:`tests.model.invariants`); and a breadth-first search of every state
reachable within small bounds, which prints the shortest trace to a violation
(:mod:`tests.model.explore`).
``tests/unit/test_protocol_model.py`` runs it on the protocol as built and on
seeded mutations of it.
"""
