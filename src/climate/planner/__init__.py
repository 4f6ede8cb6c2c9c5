"""Capacity over time. Pure: no I/O, no ORM objects, no clock (time is a parameter)."""
