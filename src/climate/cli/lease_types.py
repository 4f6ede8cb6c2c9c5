"""The lease type options of ``lease create`` (docs/lease-types.md): ``--type``, ``--priority``,
``--max-attempts``, ``--deadline`` and ``--hold``, as the API's fields."""

from __future__ import annotations

import argparse
import re
from typing import Any

LEASE_TYPES = ("scheduled", "immediate", "retry", "best_effort")
_HOLD = re.compile(r"([0-9]{1,9})([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def add_lease_type_options(parser: argparse.ArgumentParser) -> None:
    """``--type``, ``--priority``, ``--max-attempts``, ``--deadline``, ``--hold``."""
    parser.add_argument("--type", choices=LEASE_TYPES, help="the lease type (default scheduled)")
    parser.add_argument("--priority", type=int, help="place in the waiting queue, higher first")
    parser.add_argument("--max-attempts", type=int, help="retry leases: attempts at most")
    parser.add_argument("--deadline", help="best_effort leases: stop hunting at this date")
    parser.add_argument(
        "--hold",
        metavar="DURATION",
        help="create the lease HELD for this long (600, 10m, 2h, 01:30) until `lease confirm`",
    )


def lease_type_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The lease type options as the API's fields (docs/lease-types.md)."""
    fields: dict[str, Any] = {}
    if args.type is not None:
        fields["lease_type"] = args.type
    if args.priority is not None:
        fields["priority"] = args.priority
    if args.max_attempts is not None:
        fields["retries"] = args.max_attempts
    if args.deadline is not None:
        fields["deadline"] = args.deadline
    if args.hold is not None:
        fields["hold"] = {"expires_in": hold_seconds(args.hold)}
    return fields


def hold_seconds(text: str) -> int:
    """``--hold``: whole seconds, or a number with ``s``, ``m``, ``h`` or ``d``, or ``HH:MM``."""
    clean = text.strip().lower()
    hours, sep, minutes = clean.partition(":")
    if sep and hours.isdigit() and minutes.isdigit() and len(minutes) == 2:
        return int(hours) * 3600 + int(minutes) * 60
    found = _HOLD.fullmatch(clean)
    if found is None:
        raise SystemExit(f"error: --hold wants a duration like 600, 10m, 2h or 01:30, not {text!r}")
    return int(found.group(1)) * _UNITS[found.group(2)]
