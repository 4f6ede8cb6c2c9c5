"""The openstack backend: Nova and Placement driven as Blazar 18 drives them (openstacksdk).

Host reservations (Blazar's ``plugins/oshosts``): reservable hosts live in the freepool
aggregate; at start an aggregate named by the reservation id, in the availability zone
``<az_prefix><reservation id>``, with metadata ``<owner_key>=<project>`` and
``<project>=<project_id_key>``, takes the hosts from the freepool (BlazarFilter lets only that
project, with the hint ``reservation=<id>``, boot there); at the end the end policy is applied to
the servers still on the hosts, the hosts go back to the freepool and the aggregate is deleted.
A host is always added to its new aggregate before it leaves the old one, so a failure never
leaves it outside every aggregate.

Instance reservations (``plugins/instances``): a private flavor ``reservation:<id>`` (id = the
reservation id) with ``aggregate_instance_extra_specs:reservation=<id>``,
``resources:CUSTOM_RESERVATION_<ID>=1`` and ``affinity_id``, granted to the project during the
lease; an aggregate named by the reservation id with ``reservation``, ``filter_tenant_id``,
``affinity_id`` and ``<owner_key>`` (its hosts stay in the freepool); the capacity as an
inventory of ``CUSTOM_RESERVATION_<ID>`` on a child provider ``blazar_<host>`` of each reserved
compute; a server group ``reservation:<id>`` when the reservation has an affinity rule.

Every action is idempotent (it finds what a previous attempt made before making it) and a start
that fails undoes what it did, so a retry or the final ERROR leaves nothing half made.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

from climate.backends.base import (
    Acknowledge,
    Action,
    Backend,
    BeforeEnd,
    Done,
    End,
    Enrol,
    Handover,
    HostState,
    Inspected,
    InspectUsage,
    Migrate,
    Migration,
    PowerOff,
    PowerOn,
    Replace,
    ResourceInUse,
    Result,
    Start,
    StartManual,
    UnknownResource,
    Usage,
    Withdraw,
)
from climate.backends.openstack.aggregates import Aggregates
from climate.backends.openstack.compute_services import (
    POWER_REASON,
    availability_zone,
    cpu_info,
    find_hypervisor,
    host_states,
    listen_for_service_updates,
    set_compute_service,
)
from climate.backends.openstack.config import CloudConfig, connect
from climate.backends.openstack.flavors import (
    drop_flavor,
    drop_server_group,
    find_server_group,
    make_flavor,
)
from climate.backends.openstack.placement import Placement, resource_class
from climate.backends.openstack.servers import (
    HOSTS,
    INSTANCES,
    RESERVATION_PREFIX,
    delete_servers,
    flavor_id,
    inspect_usage,
    kept,
    servers_of,
    wait_for,
)
from climate.config import Settings
from climate.domain.status import EndPolicy
from climate.errors import InvalidInput
from climate.keystone import log_in, trust_scoped

LOG = logging.getLogger(__name__)
T = TypeVar("T")

SHELVED = frozenset({"SHELVED", "SHELVED_OFFLOADED"})
STOPPED = frozenset({"SHUTOFF"})


class OpenStackBackend(Backend):
    name = "openstack"
    can_migrate = True
    watches_hosts = True

    def __init__(self, conn: Any, config: CloudConfig, timeout: float | None = None) -> None:
        self.conn = conn
        self.config = config
        self.timeout = timeout
        self.placement = Placement(conn, config.server_deletion_seconds)
        self.aggregates = Aggregates(conn, config.freepool_name)

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """Connect as the service user and check that Keystone takes its credentials and the
        catalog has Nova and Placement.

        :raises InvalidInput: naming the setting that is missing or wrong.
        """
        config = CloudConfig.from_settings(settings)
        log_in(config.credentials, settings.backend_timeout_seconds)
        conn = connect(config, settings.backend_timeout_seconds)
        for service in ("compute", "placement"):
            if conn.endpoint_for(service) is None:
                raise InvalidInput(
                    "os_region_name",
                    f"no {service} endpoint in the Keystone catalog for region "
                    f"{config.credentials.region_name or '(any)'}",
                )
        return cls(conn, config, settings.backend_timeout_seconds)

    # -- the one method ----------------------------------------------------------------------

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results: list[Result] = []
        for action in actions:
            try:
                results.append(self._one(action))
            except Exception as exc:
                LOG.warning("openstack backend: %s failed: %s", type(action).__name__, exc)
                results.append(exc)
        return results

    def _one(self, action: Action) -> Done | Inspected | Usage:
        if isinstance(action, Start):
            made: dict[str, Mapping[str, Any]] = {}
            for params in self._each(self._start, action.handovers):
                made.update(params)
            return Done(made)
        if isinstance(action, End):
            self._each(self._end, action.handovers)
            return Done()
        if isinstance(action, BeforeEnd):
            for handover, what in action.steps:
                if what == "snapshot":
                    for server in servers_of(self.conn, handover):
                        self.conn.compute.create_server_image(
                            server, f"{RESERVATION_PREFIX}:{handover.reservation_id}:{server.id}"
                        )
            return Done()
        if isinstance(action, StartManual):
            for server in servers_of(self.conn, action.handover):
                if server.status == "SHUTOFF":
                    self.conn.compute.start_server(server)
            return Done()
        if isinstance(action, Acknowledge):
            delete_servers(
                self.conn,
                list(kept(self.conn, action.handover)),
                self.config.server_deletion_seconds,
            )
            self._cleanup(action.handover, keep=False)
            return Done()
        if isinstance(action, Migrate):
            for move in action.moves:
                self._migrate(move)
            return Done()
        if isinstance(action, Withdraw):
            self._withdraw(action)
            return Done()
        if isinstance(action, Replace):
            self._replace(action)
            return Done()
        if isinstance(action, PowerOff):
            set_compute_service(self.conn, action.name, f"{POWER_REASON}: {action.reason}")
            return Done()
        if isinstance(action, PowerOn):
            set_compute_service(self.conn, action.name, None)
            return Done()
        if isinstance(action, InspectUsage):
            return inspect_usage(self.conn, action.handovers)
        return self._enrol(action)

    def _each(self, work: Callable[[Handover], T], handovers: Sequence[Handover]) -> list[T]:
        """``work`` on each handover, ``concurrency`` at a time (a lease's reservations have
        nothing in common in Nova and Placement but the freepool, whose host moves are separate
        calls); once all have finished, the first failure is raised (each start undid itself,
        and the retry finds what the others made)."""
        if len(handovers) <= 1 or self.config.concurrency == 1:
            return [work(h) for h in handovers]
        workers = min(self.config.concurrency, len(handovers))
        with ThreadPoolExecutor(workers, thread_name_prefix="climate-openstack") as pool:
            futures = [pool.submit(work, h) for h in handovers]
        for future in futures:
            failure = future.exception()
            if failure is not None:
                raise failure
        return [f.result() for f in futures]

    # -- host health ---------------------------------------------------------------------------

    def host_states(self) -> Mapping[str, HostState]:
        return host_states(self.conn)

    def on_host_change(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Woken by Nova's ``service.update`` notifications on ``nova_transport_url``."""
        if not self.config.nova_transport_url:
            return None
        return listen_for_service_updates(
            self.config.nova_transport_url, self.config.nova_notification_topic, wake
        )

    # -- enrolment ---------------------------------------------------------------------------

    def _enrol(self, action: Enrol) -> Inspected:
        """The hypervisor as Nova and Placement know it; it joins the freepool."""
        if action.resource_type != HOSTS:
            return Inspected()
        hypervisor = find_hypervisor(self.conn, action.name)
        if hypervisor is None:
            raise UnknownResource(f"Nova has no hypervisor named {action.name!r}")
        service_host = str(hypervisor["service"]["host"])
        if action.vacant:
            self._refuse_servers(action.name, service_host)
        fields: dict[str, Any] = {
            "vcpus": hypervisor.get("vcpus"),
            "memory_mb": hypervisor.get("memory_mb"),
            "local_gb": hypervisor.get("local_gb"),
            "service_name": service_host,
            "hypervisor_type": hypervisor.get("hypervisor_type"),
            "hypervisor_version": hypervisor.get("hypervisor_version"),
            "cpu_info": cpu_info(hypervisor),
        }
        traits = self.placement.get(f"/resource_providers/{hypervisor['id']}/traits")
        properties = {
            trait: "true"
            for trait in (traits or {}).get("traits", [])
            if trait.startswith("CUSTOM_")
        }
        zone = availability_zone(self.conn, service_host)
        if zone is not None:  # a Blazar column, kept as a property (blazar_terms)
            properties["availability_zone"] = zone
        freepool = self.aggregates.find(self.config.freepool_name, create=True)
        if service_host not in (freepool.hosts or []):
            self.conn.compute.add_host_to_aggregate(freepool, service_host)
        return Inspected({k: v for k, v in fields.items() if v is not None}, properties)

    def _refuse_servers(self, name: str, service_host: str) -> None:
        """:raises ResourceInUse: servers (of any project) run on the host, naming them."""
        running = [
            s.id for s in self.conn.compute.servers(all_projects=True, compute_host=service_host)
        ]
        if running:
            raise ResourceInUse(f"Servers [{', '.join(running)}] found for host {name}")

    def _withdraw(self, action: Withdraw) -> None:
        """The host out of the freepool: BlazarFilter then lets unhinted boots on it again.
        With ``vacant``, refused first if servers run on it, as Blazar's delete_computehost."""
        if action.resource_type != HOSTS:
            return
        hypervisor = find_hypervisor(self.conn, action.name)
        host = str(hypervisor["service"]["host"]) if hypervisor is not None else action.name
        if action.vacant and hypervisor is not None:
            self._refuse_servers(action.name, host)
        freepool = self.aggregates.find(self.config.freepool_name)
        if freepool is not None and host in (freepool.hosts or []):
            self.aggregates.remove_host(freepool, host)

    # -- start and end -------------------------------------------------------------------------

    def _start(self, handover: Handover) -> Mapping[str, Mapping[str, Any]]:
        try:
            if handover.resource_type == HOSTS:
                self._start_hosts(handover)
                return {}
            if handover.resource_type == INSTANCES:
                return self._start_instances(handover)
        except Exception:
            LOG.warning("reservation %s: start failed, undoing it", handover.reservation_id)
            try:
                self._cleanup(handover)
            except Exception:
                LOG.exception("reservation %s: undoing the start failed", handover.reservation_id)
            raise
        return {}

    def _start_hosts(self, h: Handover) -> None:
        aggregate = self.aggregates.find(
            h.reservation_id, create=True, az=f"{self.config.az_prefix}{h.reservation_id}"
        )
        self.conn.compute.set_aggregate_metadata(
            aggregate,
            {self.config.owner_key: h.project_id, h.project_id: self.config.project_id_key},
        )
        self.aggregates.move_in(aggregate, sorted(set(h.hosts.values())), leave_freepool=True)

    def _replace(self, action: Replace) -> None:
        """A failed host of a running host reservation swapped for a spare: the spare into the
        reservation's aggregate (then out of the freepool), the failed one back into the
        freepool (then out of the aggregate), so neither is ever outside every aggregate."""
        h = action.handover
        if h.resource_type == INSTANCES:
            self._replace_instances(action)
            return
        if h.resource_type != HOSTS:
            raise ValueError(
                f"only host and instance reservations are healed, not {h.resource_type}"
            )
        aggregate = self.aggregates.find(h.reservation_id)
        if aggregate is None:  # no start has made it yet: make it with the hosts held now
            self._start_hosts(h)
            return
        if action.new_host is not None:
            self.aggregates.move_in(aggregate, [h.hosts[action.new_host]], leave_freepool=True)
        if action.old_host is not None:
            old = h.hosts[action.old_host]
            freepool = self.aggregates.find(self.config.freepool_name, create=True)
            if old not in (freepool.hosts or []):
                self.conn.compute.add_host_to_aggregate(freepool, old)
            aggregate = self.aggregates.find(h.reservation_id)
            if old in (aggregate.hosts or []):
                self.aggregates.remove_host(aggregate, old)

    def _replace_instances(self, action: Replace) -> None:
        """Instances of a running reservation moved off a failed host, as Blazar's
        ``_pre_reallocate`` / ``_post_reallocate``: the new host into the reservation's
        aggregate (it stays in the freepool) with the reservation's inventory on its
        ``blazar_<host>`` provider sized to the slots it now holds; the failed host out of the
        aggregate and its inventory removed (left, when the failed host's servers still hold
        allocations on it: Placement refuses, and the aggregate no longer lets the flavor
        schedule there)."""
        h = action.handover
        rid = h.reservation_id
        aggregate = self.aggregates.find(rid)
        if aggregate is None:  # no start has made it yet: nothing in Nova to change
            return
        rc = resource_class(rid)
        per_host = _slots(h)
        if action.new_host is not None:
            new = h.hosts[action.new_host]
            self.aggregates.move_in(aggregate, [new], leave_freepool=False)
            self.placement.set_inventory(new, rc, per_host[new])
        if action.old_host is not None:
            old = h.hosts[action.old_host]
            if old in per_host:
                return
            aggregate = self.aggregates.find(rid)
            if old in (aggregate.hosts or []):
                self.aggregates.remove_host(aggregate, old)
            self.placement.delete_inventory(old, rc, in_use_ok=True)

    def _start_instances(self, h: Handover) -> Mapping[str, Mapping[str, Any]]:
        rid = h.reservation_id
        group_id = self._server_group(h)
        flavor = make_flavor(self.conn, h, group_id)
        try:
            self.conn.compute.flavor_add_tenant_access(flavor, h.project_id)
        except Exception as exc:  # granted already by an earlier attempt
            if "409" not in str(exc) and "already" not in str(exc).lower():
                raise
        metadata = {
            RESERVATION_PREFIX: rid,
            "filter_tenant_id": h.project_id,
            self.config.owner_key: h.project_id,
        }
        if group_id is not None:
            metadata["affinity_id"] = group_id
        aggregate = self.aggregates.find(rid, create=True)
        self.conn.compute.set_aggregate_metadata(aggregate, metadata)
        per_host = _slots(h)
        self.aggregates.move_in(aggregate, sorted(per_host), leave_freepool=False)
        rc = resource_class(rid)
        self.placement.make_resource_class(rc)
        for host, count in per_host.items():
            self.placement.set_inventory(host, rc, count)
        return {} if group_id is None else {rid: {"server_group_id": group_id}}

    def _server_group(self, h: Handover) -> str | None:
        affinity = h.params.get("affinity")
        if affinity is None:
            return None
        made = find_server_group(self.conn, h.reservation_id)
        if made is not None:
            return made
        name = f"{RESERVATION_PREFIX}:{h.reservation_id}"
        policy = "affinity" if affinity else "anti-affinity"
        return str(self._lessee_compute(h).create_server_group(name=name, policy=policy).id)

    def _lessee_compute(self, h: Handover) -> Any:
        """Nova as the lessee, through the trust of its lease (as Blazar makes the server group
        in the lessee's project, so that the lessee may name it in a ``group`` hint); as the
        service user where there is no trust or Keystone does not take it (logged)."""
        auth = None if h.trust_id is None else trust_scoped(self.config.credentials, h.trust_id)
        if auth is None:
            return self.conn.compute
        try:
            conn = connect(self.config, self.timeout, auth)
            conn.authorize()
        except Exception:
            LOG.warning("trust %s of lease %s not usable", h.trust_id, h.lease_id, exc_info=True)
            return self.conn.compute
        return conn.compute

    def _end(self, h: Handover) -> None:
        if h.resource_type == INSTANCES:
            # As Blazar's on_end, the project's access to the flavor goes first: a boot after
            # the listing below would outlive the lease (and hold its inventory).
            drop_flavor(self.conn, h, keep=True)
        servers = list(servers_of(self.conn, h))
        policy = h.end_policy
        if policy is EndPolicy.SNAPSHOT:
            for server in servers:
                self.conn.compute.create_server_image(
                    server, f"{RESERVATION_PREFIX}:{h.reservation_id}:{server.id}"
                )
        if policy is EndPolicy.KEEP_UNTIL_ACK:
            for server in servers:
                if server.status == "ACTIVE":
                    self.conn.compute.stop_server(server)
            wait_for(self.conn, servers, STOPPED, self.config.server_deletion_seconds)
        elif policy is EndPolicy.SUSPEND:
            for server in servers:
                if server.status not in SHELVED:
                    self.conn.compute.shelve_server(server)
            wait_for(self.conn, servers, SHELVED, self.config.server_deletion_seconds)
        else:
            delete_servers(self.conn, servers, self.config.server_deletion_seconds)
        self._cleanup(h, keep=policy is EndPolicy.KEEP_UNTIL_ACK)

    def _cleanup(self, h: Handover, *, keep: bool = False) -> None:
        """Everything the reservation's start made, undone (each step a no-op when done).

        ``keep``: an instance reservation's keep-until-ack end, whose stopped servers still hold
        their Placement allocations: only the project's access to the flavor and the aggregate
        go; the flavor, group and inventory stay until ``Acknowledge`` deletes the servers."""
        rid = h.reservation_id
        if h.resource_type == HOSTS:
            self.aggregates.dissolve(rid)
        if h.resource_type != INSTANCES:
            return
        # Each part is undone even where another fails (Placement down must not leave Nova's
        # flavor and aggregate behind); the first failure is raised after all were tried.
        steps: list[Callable[[], None]] = [lambda: drop_flavor(self.conn, h, keep=keep)]
        if not keep:
            steps += [lambda: drop_server_group(self.conn, rid), lambda: self._drop_inventory(h)]
        steps.append(lambda: self.aggregates.drop(rid))
        failures: list[Exception] = []
        for step in steps:
            try:
                step()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _drop_inventory(self, h: Handover) -> None:
        rc = resource_class(h.reservation_id)
        for host in sorted(set(_slots(h)) | self.placement.holders(rc)):
            self.placement.delete_inventory(host, rc)
        self.placement.delete(f"/resource_classes/{rc}")

    def _migrate(self, move: Migration) -> None:
        """The reservation's servers on the old host live-migrated to the new one, its
        Placement inventory and aggregate membership moved with them (the new host added
        first: Nova's scheduler checks the flavor's aggregate and capacity on the target)."""
        if not move.from_name or not move.to_name:
            raise UnknownResource(f"migration of {move.reservation_id}: host name unknown")
        rc = resource_class(move.reservation_id)
        servers = [
            s
            for s in self.conn.compute.servers(all_projects=True)
            if s.compute_host == move.from_name and flavor_id(s) == move.reservation_id
        ]
        reserved = self.placement.rc_exists(rc)
        if reserved:
            self.placement.set_inventory(
                move.to_name, rc, self.placement.total(move.to_name, rc) + move.count
            )
        pool = self.aggregates.find(move.reservation_id)
        if pool is not None:
            self.aggregates.move_in(pool, [move.to_name], leave_freepool=False)
        for server in servers:
            self.conn.compute.live_migrate_server(server, host=move.to_name, block_migration="auto")
        deadline = time.monotonic() + self.config.server_deletion_seconds
        for server in servers:
            while True:
                now = self.conn.compute.get_server(server.id)
                if now.compute_host == move.to_name and now.status == "ACTIVE":
                    break
                if now.status == "ERROR" or time.monotonic() > deadline:
                    raise RuntimeError(f"server {server.id} did not migrate to {move.to_name}")
                time.sleep(0.2)
        if reserved:
            left = self.placement.total(move.from_name, rc) - move.count
            if left > 0:
                self.placement.set_inventory(move.from_name, rc, left)
                return
            self.placement.delete_inventory(move.from_name, rc)
        pool = self.aggregates.find(move.reservation_id)
        if pool is not None and move.from_name in (pool.hosts or []):
            self.aggregates.remove_host(pool, move.from_name)


def _slots(h: Handover) -> dict[str, int]:
    """Host name -> instance slots of an instance reservation (ids ``<host id>:<n>``)."""
    counts = Counter(r.partition(":")[0] for r in h.resource_ids)
    return {h.hosts[host_id]: n for host_id, n in counts.items() if host_id in h.hosts}
