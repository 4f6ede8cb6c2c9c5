"""What the inventories (hosts, items, volume pools) share: checking extra properties and ids,
paging, refusing to delete what is held, and auditing their changes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from climate.context import Page
from climate.db import audit as audit_rows
from climate.db.tables import PROPERTY_NAME_LENGTH, PROPERTY_VALUE_LENGTH
from climate.domain.actor import Actor
from climate.errors import InvalidInput, ResourceInUse
from climate.inputs import MAX_INT as MAX_INT
from climate.inputs import free_text, name_text, shown

READ_ONLY = frozenset({"id", "created_at", "updated_at"})
_Found = TypeVar("_Found")
_Marker = TypeVar("_Marker")


def parse_id(text: str) -> int | None:
    """An inventory id (an unsigned 32-bit integer), or None: an unknown id, not an error."""
    if text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_INT:
        return int(text)
    return None


def reservable(fields: dict[str, Any]) -> bool | None:
    """``reservable`` taken out of ``fields`` (None when absent)."""
    if "reservable" not in fields:
        return None
    return as_reservable(fields.pop("reservable"))


def as_reservable(value: object) -> bool:
    """``reservable`` as given: a JSON boolean, or the text ``true`` or ``false`` in any case,
    which is what the blazar CLI sends for ``--extra reservable=false``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidInput("reservable", "must be true or false (a JSON boolean, or that text)")


def properties(fields: Mapping[str, Any], *, creating: bool) -> dict[str, str | None]:
    """Extra properties as text; None removes one (on update only)."""
    found: dict[str, str | None] = {}
    for key, value in fields.items():
        check_key(key)
        if value is None:
            if creating:
                raise InvalidInput(key, "a new property needs a value")
            found[key] = None
            continue
        found[key] = property_text(key, value)
    return found


def check_key(key: object, read_only: frozenset[str] = READ_ONLY) -> None:
    """:raises InvalidInput: ``key`` is no property name (1 to ``PROPERTY_NAME_LENGTH``
    characters, none a control character), or one of the ``read_only`` fields."""
    if not isinstance(key, str) or not key or len(key) > PROPERTY_NAME_LENGTH:
        raise InvalidInput(
            "properties", f"property names are 1 to {PROPERTY_NAME_LENGTH} characters"
        )
    name_text(f"properties.{shown(key)}", key)
    if key in read_only:
        raise InvalidInput(key, "cannot be set")


def property_text(key: str, value: object, limit: int | None = PROPERTY_VALUE_LENGTH) -> str:
    """A string or a number as stored text: one line, or any length of lines without a
    ``limit``.

    :raises InvalidInput: another type, text longer than ``limit``, or a control character.
    """
    if isinstance(value, bool):
        return str(value)
    if not isinstance(value, str | int | float):
        raise InvalidInput(key, "must be a string or a number")
    text = str(value)
    if limit is None:
        return free_text(key, text)
    if len(text) > limit:
        raise InvalidInput(key, f"at most {limit} characters")
    return name_text(key, text)


def page_of(
    session: Session,
    page: Page,
    *,
    what: str,
    find: Callable[[Session, str], _Marker | None],
    rows: Callable[..., Sequence[_Found]],
    sort_keys: tuple[str, ...],
    cap: int,
) -> Sequence[_Found]:
    """A page of an inventory: ``rows`` (a ``db`` listing taking ``limit``, ``marker``,
    ``sort_key`` and ``descending``) after the ``page.marker`` that ``find`` looks up (the
    rows may be the resources, or less of them: their ids).

    :raises InvalidInput: ``page.marker`` is no ``what``, or ``page.sort_key`` is not one of
        ``sort_keys``.
    """
    marker = None
    if page.marker is not None:
        marker = find(session, page.marker)
        if marker is None:
            raise InvalidInput("marker", f"no {what} {page.marker}")
    return rows(
        session,
        limit=page.blazar_size(cap),
        marker=marker,
        sort_key=page.key(sort_keys),
        descending=page.sort_dir == "desc",
    )


def refuse_if_held(what: str, holders: Sequence[str], blazar: str = "") -> None:
    """:raises ResourceInUse: leases ``holders`` have current or future allocations of
    ``what`` (e.g. "host 3 (compute-0)"), so it cannot be deleted; ``blazar``, Blazar's own
    words for that refusal, come first."""
    if holders:
        said = f"{what} has current or future allocations in lease(s) {', '.join(holders)}"
        raise ResourceInUse(f"{blazar} {said}" if blazar else said)


def grouped(
    resource_ids: Iterable[int], rows: Iterable[_Found], key: Callable[[_Found], int]
) -> dict[int, list[_Found]]:
    """``rows`` per resource id (``key``), each of ``resource_ids`` present even with none."""
    found: dict[int, list[_Found]] = {i: [] for i in resource_ids}
    for row in rows:
        found.setdefault(key(row), []).append(row)
    return found


def audit(
    session: Session,
    now: dt.datetime,
    actor: Actor,
    target_type: str,
    action: str,
    target_id: int,
    detail: Mapping[str, Any],
) -> None:
    """Record ``actor``'s ``action`` on an inventory row as ``<target_type>.<action>``."""
    audit_rows.record(
        session,
        at=now,
        actor=actor,
        action=f"{target_type}.{action}",
        target_type=target_type,
        target_id=str(target_id),
        detail=detail,
    )
