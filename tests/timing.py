"""How tests bound a duration without depending on the machine's speed."""

LATE = 5.0
"""Seconds a timer may fire late on a loaded machine (two test runs on two busy
cores), with room to spare. A test that bounds a duration adds it to the deadline
it checks, and makes anything else that could end the wait take longer still: the
bound then proves which of them ended it, and says nothing about speed."""
