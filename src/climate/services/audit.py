"""Reading the audit log (admins by default: ``climate:audit:get``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import audit
from climate.db.records import AuditLog
from climate.domain.actor import Actor
from climate.errors import InvalidInput


class AuditService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def list_all(
        self,
        actor: Actor,
        *,
        target_type: str | None = None,
        target_id: str | None = None,
        action: str | None = None,
        since: dt.datetime | None = None,
        page: Page = FIRST_PAGE,
    ) -> Sequence[AuditLog]:
        """Audit rows matching every filter given, oldest first, a page at a time.

        :raises InvalidInput: ``marker`` is not the id of an audit row.
        """
        self.ctx.policy.enforce(actor, "climate:audit:get")
        with self.ctx.db.reader() as session:
            after = None
            if page.marker is not None:
                marker = page.marker.strip()
                if not (marker.isascii() and marker.isdigit() and len(marker) <= 18):
                    raise InvalidInput("marker", "must be the id of an audit record")
                after = int(marker)
                if not audit.exists(session, after):
                    raise InvalidInput("marker", f"no audit record {after}")
            return audit.find(
                session,
                target_type=target_type,
                target_id=target_id,
                action=action,
                since=since,
                after_id=after,
                limit=page.size(self.ctx.settings.max_page_size),
            )
