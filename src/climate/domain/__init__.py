"""Leases, reservations, events, their statuses and the rules that move them."""
