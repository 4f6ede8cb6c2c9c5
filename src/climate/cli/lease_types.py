"""The lease type options of ``lease create`` (docs/lease-types.md): ``--type``, ``--priority``,
``--max-attempts``, ``--deadline`` and ``--hold``, as the API's fields."""

from __future__ import annotations

import argparse
from typing import Any

from climate.cli.durations import EXAMPLES, seconds

LEASE_TYPES = ("scheduled", "immediate", "retry", "best_effort")


def add_lease_type_options(parser: argparse.ArgumentParser) -> None:
    """``--type``, ``--priority``, ``--max-attempts``, ``--deadline``, ``--hold``."""
    parser.add_argument("--type", choices=LEASE_TYPES, help="the lease type (default scheduled)")
    parser.add_argument("--priority", type=int, help="place in the waiting queue, higher first")
    parser.add_argument("--max-attempts", type=int, help="retry leases: attempts at most")
    parser.add_argument("--deadline", help="best_effort leases: stop hunting at this date")
    parser.add_argument(
        "--hold",
        type=seconds,
        metavar="DURATION",
        help=f"create the lease HELD for this long ({EXAMPLES}) until `lease confirm`",
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
        fields["hold"] = {"expires_in": args.hold}
    return fields
