"""``--reservation key=value,...`` and the hosts of ``--min``/``--max``/``--properties``: the
reservations of ``lease create``, ``series create`` and ``availability search`` as request
bodies, and back."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import Any

HOST_TYPE = "physical:host"
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SPECIAL = frozenset(',"[]{}')
_HOST_OPTIONS = frozenset(
    {"resource_type", "min", "max", "hypervisor_properties", "resource_properties", "before_end"}
)


def add_reservation_options(parser: argparse.ArgumentParser) -> None:
    """``--min``, ``--max``, ``--properties`` (hosts) and ``--reservation`` (any type)."""
    parser.add_argument("--min", type=int, help="hosts wanted at least (default 1)")
    parser.add_argument("--max", type=int, help="hosts wanted at most (default: min)")
    parser.add_argument(
        "--properties", help='resource_properties query, e.g. \'["==", "$gpu", "a100"]\''
    )
    parser.add_argument(
        "--reservation",
        action="append",
        default=[],
        metavar="KEY=VALUE,KEY=VALUE...",
        help="a reservation of any type instead of hosts, e.g. resource_type=virtual:instance,"
        "amount=2,vcpus=2,memory_mb=4096,disk_gb=20; JSON values (lists, numbers) are sent as "
        "JSON; repeat it for several reservations",
    )


def requested_reservations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``--reservation``s, or else one reservation of ``--min``..``--max`` hosts matching
    ``--properties``; giving both is an error."""
    if not args.reservation:
        minimum = 1 if args.min is None else args.min
        return [
            {
                "resource_type": HOST_TYPE,
                "min": minimum,
                "max": args.max if args.max is not None else minimum,
                "hypervisor_properties": "",
                "resource_properties": args.properties or "",
            }
        ]
    if args.min is not None or args.max is not None or args.properties is not None:
        raise SystemExit(
            "error: --reservation replaces --min, --max and --properties; reserve hosts with "
            "--reservation resource_type=physical:host,min=1,max=2,resource_properties=..."
        )
    return [parse_reservation(text) for text in args.reservation]


def parse_reservation(text: str) -> dict[str, Any]:
    """One ``--reservation key=value,key=value...`` as a reservation body, as ``blazar
    lease-create --reservation`` takes it. A value that reads as JSON (a list, an object, a
    number, true/false/null, a quoted string) is sent as that JSON, so
    ``required_floatingips=["10.0.0.5"]`` is a list; commas inside brackets or quotes do not
    split pairs."""
    found: dict[str, Any] = {}
    for pair in _pairs(text):
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SystemExit(
                f"error: --reservation {text!r}: {pair!r} is not key=value "
                "(pairs are separated by commas)"
            )
        if key in found:
            raise SystemExit(f"error: --reservation {text!r} gives {key} twice")
        found[key] = _json_or_text(value.strip())
    if not found.get("resource_type"):
        raise SystemExit(
            f"error: --reservation {text!r} names no resource_type "
            "(e.g. resource_type=virtual:instance)"
        )
    return found


def reservation_options(reservations: list[Mapping[str, Any]]) -> str:
    """Reservation bodies as ``lease create`` options that ask for them again: ``--min``,
    ``--max`` and ``--properties`` for one plain host reservation, else a ``--reservation``
    each that ``parse_reservation`` reads back as the same body."""
    if len(reservations) == 1 and _plain_hosts(reservations[0]):
        (hosts,) = reservations
        shown = f"--min {hosts['min']} --max {hosts['max']}"
        if hosts.get("resource_properties"):
            shown += f" --properties {shlex.quote(str(hosts['resource_properties']))}"
        return shown
    return " ".join(
        "--reservation " + shlex.quote(",".join(f"{k}={_value(v)}" for k, v in r.items()))
        for r in reservations
    )


def _plain_hosts(reservation: Mapping[str, Any]) -> bool:
    """Whether ``--min``/``--max``/``--properties`` ask for exactly this reservation."""
    return (
        reservation.get("resource_type") == HOST_TYPE
        and set(reservation) <= _HOST_OPTIONS
        and not reservation.get("hypervisor_properties")
        and reservation.get("before_end") in (None, "default")
    )


def _value(value: Any) -> str:
    """A value as ``parse_reservation`` reads it back: text as is unless it would read as JSON
    or split a pair, then quoted."""
    if not isinstance(value, str):
        return json.dumps(value, separators=(",", ":"))
    plain = _json_or_text(value) == value and value == value.strip()
    return value if plain and not _SPECIAL & set(value) else json.dumps(value)


def _pairs(text: str) -> Iterator[str]:
    depth, quoted, start = 0, False, 0
    for i, char in enumerate(text):
        if char == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif quoted:
            continue
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _json_or_text(value: str) -> Any:
    looks_json = value[:1] in ("[", "{", '"') or value in ("true", "false", "null")
    if looks_json or _NUMBER.fullmatch(value):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
