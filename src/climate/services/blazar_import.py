"""Moving from Blazar: a Blazar database's leases, hosts and floating IPs into Climate.

One transaction under the admission lock: everything is written or nothing. Blazar's lease,
reservation and event ids are kept (a host reservation's aggregate and an instance
reservation's flavor are named by the reservation id), and so is a host's id when it is a
number. What cannot be mapped is named in the report; the import refuses to run past it
unless told to leave it out. Running it again writes only what is not there yet.
"""

from __future__ import annotations

from climate.backends.base import Enrol, Timeboxed, UnknownResource
from climate.context import ServiceContext
from climate.db import audit as audit_rows
from climate.db import blazar_import as blazar_rows
from climate.db.blazar_import import BlazarRows
from climate.db.engine import ADMISSION_LOCK
from climate.errors import BackendError, ClimateError
from climate.services.blazar_mapping import BlazarMapping
from climate.services.blazar_terms import FLOATING_KIND, HOSTS, ImportReport


class Unmappable(ClimateError):
    """The Blazar database has rows Climate cannot map; nothing was written."""

    status = 409
    name = "UNMAPPABLE"


class BlazarImportService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        """Asked about each host (``Enrol``): one the cloud no longer knows is unmappable."""

    def run(self, url: str, *, dry_run: bool, skip_unmappable: bool = False) -> ImportReport:
        """Import the Blazar database at ``url``; ``dry_run``: report, write nothing.

        :raises Unmappable: some rows cannot be mapped and ``skip_unmappable`` is not set
            (nothing is written; the message names every one).
        :raises InvalidInput: ``url`` is not a readable Blazar database.
        """
        source = blazar_rows.read(url)
        unknown_hosts = self._unknown_hosts(source)
        report = ImportReport(dry_run=dry_run)
        with self.ctx.db.transaction(lock=ADMISSION_LOCK, rollback=dry_run) as session:
            version = int(session.info["lock_version"])
            lease_ids = [r["id"] for r in source.of("leases")]
            mapping = BlazarMapping(
                self.ctx,
                source,
                blazar_rows.present(session, lease_ids, FLOATING_KIND),
                unknown_hosts,
                report,
                self.ctx.clock.now(),
            )
            hosts, items, settings = mapping.inventory()
            blazar_rows.add_inventory(session, hosts, items, settings)
            leases, instance_hosts = mapping.leases()
            if report.unmappable and not skip_unmappable and not dry_run:
                raise Unmappable(
                    "the Blazar database has rows Climate cannot map (nothing was "
                    "written; --skip-unmappable imports without them): "
                    + "; ".join(report.unmappable)
                )
            report.skipped = bool(report.unmappable) and skip_unmappable
            blazar_rows.add_leases(session, leases, version, instance_hosts)
            if not dry_run and report.written:
                audit_rows.record(
                    session,
                    at=mapping.now,
                    actor="import-blazar",
                    action="blazar.import",
                    target_type="database",
                    target_id=_safe_url(url),
                    detail=report.as_dict(),
                )
        return report

    def _unknown_hosts(self, source: BlazarRows) -> dict[str, str]:
        """Blazar host names the cloud does not know, with why (asked outside any
        transaction: a slow cloud never holds the admission lock)."""
        if self.backend is None:
            return {}
        names = [h["hypervisor_hostname"] for h in source.of("computehosts")]
        names = [n for n in names if n]
        results = self.backend.handle([Enrol(HOSTS, n) for n in names])
        unknown = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, UnknownResource):
                unknown[name] = str(result)
            elif isinstance(result, BaseException):
                raise BackendError(
                    f"host {name!r}: backend {self.backend.name} could not say whether the "
                    f"cloud knows it: {result}"
                )
        return unknown


def _safe_url(url: str) -> str:
    """The URL without its password, for the audit log."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.partition(':')[0]}@{tail}"
