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
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar
from urllib.parse import quote

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
    Result,
    Start,
    StartManual,
    UnknownResource,
    Usage,
    Withdraw,
)
from climate.backends.openstack.config import CloudConfig
from climate.backends.openstack.servers import (
    HOSTS,
    INSTANCES,
    RESERVATION_PREFIX,
    flavor_id,
    inspect_usage,
)
from climate.config import Settings
from climate.domain.status import EndPolicy
from climate.errors import InvalidInput
from climate.keystone import CONNECT_RETRIES, log_in, trust_scoped

LOG = logging.getLogger(__name__)
T = TypeVar("T")
CONFLICT_ATTEMPTS = 20

FLAVOR_EXTRA_SPEC = "aggregate_instance_extra_specs:reservation"
HYPERVISOR_MICROVERSION = "2.87"
"""The last microversion whose hypervisor details carry vcpus, memory_mb and local_gb."""
SERVICES_MICROVERSION = "2.53"
"""os-services with ``forced_down`` and service UUIDs."""
POWER_REASON = "climate power policy"
"""The start of the ``disabled_reason`` of a compute service the power policy disabled: the host
monitor takes such a host as asleep, not failed."""
PLACEMENT_MICROVERSION = "1.29"
SHELVED = frozenset({"SHELVED", "SHELVED_OFFLOADED"})
STOPPED = frozenset({"SHUTOFF"})


def resource_class(reservation_id: str) -> str:
    """Blazar's custom resource class of an instance reservation."""
    return "CUSTOM_RESERVATION_" + reservation_id.upper().replace("-", "_")


def connect(
    config: CloudConfig, timeout: float | None = None, auth: Mapping[str, str] | None = None
) -> Any:
    """An openstacksdk connection as the service user (credentials as one ``auth`` dict and no
    clouds.yaml or variables read by the SDK: it would otherwise mix them with ours), or with
    ``auth`` in place of its options (a trust's scope). Each HTTP request gives up after
    ``timeout`` seconds: a hung Nova must not hold the host monitor, nor pile up abandoned
    backend threads, and is sent again on a failed connection (``CONNECT_RETRIES``)."""
    import openstack

    credentials = config.credentials
    return openstack.connect(
        auth_type=credentials.auth_type,
        auth=dict(credentials.auth if auth is None else auth),
        region_name=credentials.region_name or None,
        interface=credentials.interface or "public",
        load_yaml_config=False,
        load_envvars=False,
        api_timeout=timeout,
        connect_retries=CONNECT_RETRIES,
    )


class OpenStackBackend(Backend):
    name = "openstack"
    can_migrate = True
    watches_hosts = True

    def __init__(self, conn: Any, config: CloudConfig, timeout: float | None = None) -> None:
        self.conn = conn
        self.config = config
        self.timeout = timeout

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
                    for server in self._servers_of(handover):
                        self.conn.compute.create_server_image(
                            server, f"{RESERVATION_PREFIX}:{handover.reservation_id}:{server.id}"
                        )
            return Done()
        if isinstance(action, StartManual):
            for server in self._servers_of(action.handover):
                if server.status == "SHUTOFF":
                    self.conn.compute.start_server(server)
            return Done()
        if isinstance(action, Acknowledge):
            self._delete_servers(list(self._kept(action.handover)))
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
            self._compute_service(action.name, f"{POWER_REASON}: {action.reason}")
            return Done()
        if isinstance(action, PowerOn):
            self._compute_service(action.name, None)
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
        """Each nova-compute service's host: down when Nova reports it down (no heartbeat for
        ``service_down_time``), forced down, or disabled (Blazar's ``poll`` takes the same
        three as failures)."""
        response = self.conn.compute.get(
            "/os-services?binary=nova-compute", microversion=SERVICES_MICROVERSION
        )
        response.raise_for_status()
        states: dict[str, HostState] = {}
        for service in response.json()["services"]:
            states[str(service["host"])] = _service_state(service)
        return states

    def _compute_service(self, host: str, disabled_reason: str | None) -> None:
        """Disable (with the reason) or enable the nova-compute service of ``host``."""
        response = self.conn.compute.get(
            f"/os-services?binary=nova-compute&host={quote(host)}",
            microversion=SERVICES_MICROVERSION,
        )
        response.raise_for_status()
        services = response.json()["services"]
        if not services:
            raise UnknownResource(f"no nova-compute service on host {host!r}")
        body = (
            {"status": "enabled"}
            if disabled_reason is None
            else {"status": "disabled", "disabled_reason": disabled_reason}
        )
        response = self.conn.compute.put(
            f"/os-services/{services[0]['id']}", json=body, microversion=SERVICES_MICROVERSION
        )
        response.raise_for_status()

    def on_host_change(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Listen (oslo.messaging, pool ``climate``) for Nova's versioned ``service.update``
        notifications of nova-compute services on ``nova_transport_url``; each calls ``wake``
        (the monitor then reads os-services, which stays the one source of truth)."""
        if not self.config.nova_transport_url:
            return None
        with warnings.catch_warnings():
            # oslo.messaging imports eventlet and oslo.utils' eventletutils, both deprecated
            # (and unused with the threading executor); their import-time warnings are noise.
            warnings.simplefilter("ignore")
            import oslo_messaging
            from oslo_config import cfg

        class Endpoint:
            filter_rule = oslo_messaging.NotificationFilter(event_type=r"^service\.update$")

            def info(
                self, ctxt: object, publisher: str, event: str, payload: Any, meta: Any
            ) -> None:
                data = payload.get("nova_object.data", {}) if isinstance(payload, dict) else {}
                if data.get("binary", "nova-compute") == "nova-compute":
                    LOG.info("nova: service.update of %s", data.get("host"))
                    wake()

        transport = oslo_messaging.get_notification_transport(
            cfg.ConfigOpts(), url=self.config.nova_transport_url
        )
        listener = oslo_messaging.get_notification_listener(
            transport,
            # Nova publishes on its own exchange (its control_exchange), not "openstack".
            [oslo_messaging.Target(exchange="nova", topic=self.config.nova_notification_topic)],
            [Endpoint()],
            executor="threading",
            pool="climate",
        )
        listener.start()

        def stop() -> None:
            listener.stop()
            listener.wait()
            transport.cleanup()

        return stop

    # -- enrolment ---------------------------------------------------------------------------

    def _enrol(self, action: Enrol) -> Inspected:
        """The hypervisor as Nova and Placement know it; it joins the freepool."""
        if action.resource_type != HOSTS:
            return Inspected()
        hypervisor = self._hypervisor(action.name)
        if hypervisor is None:
            raise UnknownResource(f"Nova has no hypervisor named {action.name!r}")
        service_host = str(hypervisor["service"]["host"])
        fields: dict[str, Any] = {
            "vcpus": hypervisor.get("vcpus"),
            "memory_mb": hypervisor.get("memory_mb"),
            "local_gb": hypervisor.get("local_gb"),
            "service_name": service_host,
            "hypervisor_type": hypervisor.get("hypervisor_type"),
            "hypervisor_version": hypervisor.get("hypervisor_version"),
        }
        traits = self._placement_get(f"/resource_providers/{hypervisor['id']}/traits")
        properties = {
            trait: "true"
            for trait in (traits or {}).get("traits", [])
            if trait.startswith("CUSTOM_")
        }
        freepool = self._aggregate(self.config.freepool_name, create=True)
        if service_host not in (freepool.hosts or []):
            self.conn.compute.add_host_to_aggregate(freepool, service_host)
        return Inspected({k: v for k, v in fields.items() if v is not None}, properties)

    def _withdraw(self, action: Withdraw) -> None:
        """The host out of the freepool: BlazarFilter then lets unhinted boots on it again."""
        if action.resource_type != HOSTS:
            return
        hypervisor = self._hypervisor(action.name)
        host = str(hypervisor["service"]["host"]) if hypervisor is not None else action.name
        freepool = self._aggregate(self.config.freepool_name)
        if freepool is not None and host in (freepool.hosts or []):
            self.conn.compute.remove_host_from_aggregate(freepool, host)

    def _hypervisor(self, name: str) -> dict[str, Any] | None:
        response = self.conn.compute.get(
            "/os-hypervisors/detail", microversion=HYPERVISOR_MICROVERSION
        )
        response.raise_for_status()
        for hypervisor in response.json()["hypervisors"]:
            if name in (hypervisor["hypervisor_hostname"], hypervisor["service"]["host"]):
                return dict(hypervisor)
        return None

    # -- aggregates ----------------------------------------------------------------------------

    def _aggregate(self, name: str, *, create: bool = False, az: str | None = None) -> Any:
        for aggregate in self.conn.compute.aggregates():
            if aggregate.name == name:
                return aggregate
        if not create:
            return None
        from openstack.exceptions import HttpException

        try:
            return self.conn.compute.create_aggregate(name=name, availability_zone=az)
        except HttpException:
            # Made meanwhile by a reservation started beside this one: a 409, or a 500 when
            # both got past Nova's check for the name before either inserted it.
            made = self._aggregate(name)
            if made is None:
                raise
            return made

    def _move_in(self, aggregate: Any, hosts: Iterable[str], *, leave_freepool: bool) -> None:
        """Each host into ``aggregate`` (first), then out of the freepool if it leaves it."""
        freepool = self._aggregate(self.config.freepool_name, create=True)
        for host in hosts:
            if host not in (aggregate.hosts or []):
                aggregate = self.conn.compute.add_host_to_aggregate(aggregate, host)
            if leave_freepool and host in (freepool.hosts or []):
                freepool = self.conn.compute.remove_host_from_aggregate(freepool, host)

    def _dissolve(self, name: str) -> None:
        """Hosts of aggregate ``name`` back into the freepool (first), then out of it; the
        aggregate deleted. Nothing to do when it is gone already."""
        aggregate = self._aggregate(name)
        if aggregate is None:
            return
        freepool = self._aggregate(self.config.freepool_name, create=True)
        for host in list(aggregate.hosts or []):
            if host not in (freepool.hosts or []):
                freepool = self.conn.compute.add_host_to_aggregate(freepool, host)
            aggregate = self.conn.compute.remove_host_from_aggregate(aggregate, host)
        self.conn.compute.delete_aggregate(aggregate, ignore_missing=True)

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
        aggregate = self._aggregate(
            h.reservation_id, create=True, az=f"{self.config.az_prefix}{h.reservation_id}"
        )
        self.conn.compute.set_aggregate_metadata(
            aggregate,
            {self.config.owner_key: h.project_id, h.project_id: self.config.project_id_key},
        )
        self._move_in(aggregate, sorted(set(h.hosts.values())), leave_freepool=True)

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
        aggregate = self._aggregate(h.reservation_id)
        if aggregate is None:  # no start has made it yet: make it with the hosts held now
            self._start_hosts(h)
            return
        if action.new_host is not None:
            self._move_in(aggregate, [h.hosts[action.new_host]], leave_freepool=True)
        if action.old_host is not None:
            old = h.hosts[action.old_host]
            freepool = self._aggregate(self.config.freepool_name, create=True)
            if old not in (freepool.hosts or []):
                self.conn.compute.add_host_to_aggregate(freepool, old)
            aggregate = self._aggregate(h.reservation_id)
            if old in (aggregate.hosts or []):
                self.conn.compute.remove_host_from_aggregate(aggregate, old)

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
        aggregate = self._aggregate(rid)
        if aggregate is None:  # no start has made it yet: nothing in Nova to change
            return
        rc = resource_class(rid)
        per_host = _slots(h)
        if action.new_host is not None:
            new = h.hosts[action.new_host]
            self._move_in(aggregate, [new], leave_freepool=False)
            self._set_inventory(new, rc, per_host[new])
        if action.old_host is not None:
            old = h.hosts[action.old_host]
            if old in per_host:
                return
            aggregate = self._aggregate(rid)
            if old in (aggregate.hosts or []):
                self.conn.compute.remove_host_from_aggregate(aggregate, old)
            child = self._provider(f"blazar_{old}")
            if child is not None:
                url = f"/resource_providers/{child['uuid']}/inventories/{rc}"
                response = self.conn.placement.delete(
                    url, microversion=PLACEMENT_MICROVERSION, raise_exc=False
                )
                if response.status_code >= 400 and response.status_code not in (404, 409):
                    raise RuntimeError(
                        f"Placement DELETE {url}: {response.status_code} {response.text}"
                    )

    def _start_instances(self, h: Handover) -> Mapping[str, Mapping[str, Any]]:
        rid = h.reservation_id
        group_id = self._server_group(h)
        flavor = self._flavor(h, group_id)
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
        aggregate = self._aggregate(rid, create=True)
        self.conn.compute.set_aggregate_metadata(aggregate, metadata)
        per_host = _slots(h)
        self._move_in(aggregate, sorted(per_host), leave_freepool=False)
        rc = resource_class(rid)
        self._make_resource_class(rc)
        for host, count in per_host.items():
            self._set_inventory(host, rc, count)
        return {} if group_id is None else {rid: {"server_group_id": group_id}}

    def _server_group(self, h: Handover) -> str | None:
        affinity = h.params.get("affinity")
        if affinity is None:
            return None
        name = f"{RESERVATION_PREFIX}:{h.reservation_id}"
        for group in self.conn.compute.server_groups(all_projects=True):
            if group.name == name:
                return str(group.id)
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

    def _flavor(self, h: Handover, group_id: str | None) -> Any:
        rid = h.reservation_id
        flavor = self._find_flavor(rid)
        if flavor is None:
            flavor = self.conn.compute.create_flavor(
                id=rid,
                name=f"{RESERVATION_PREFIX}:{rid}",
                vcpus=int(h.params["vcpus"]),
                ram=int(h.params["memory_mb"]),
                disk=int(h.params["disk_gb"]),
                is_public=False,
            )
        specs = {FLAVOR_EXTRA_SPEC: rid, f"resources:{resource_class(rid)}": "1"}
        if group_id is not None:
            specs["affinity_id"] = group_id
        self.conn.compute.create_flavor_extra_specs(flavor, specs)
        return flavor

    def _find_flavor(self, flavor_id: str) -> Any:
        from openstack.exceptions import NotFoundException

        try:
            return self.conn.compute.get_flavor(flavor_id)
        except NotFoundException:
            return None

    def _end(self, h: Handover) -> None:
        servers = list(self._servers_of(h))
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
            self._wait_for(servers, STOPPED)
        elif policy is EndPolicy.SUSPEND:
            for server in servers:
                if server.status not in SHELVED:
                    self.conn.compute.shelve_server(server)
            self._wait_for(servers, SHELVED)
        else:
            self._delete_servers(servers)
        self._cleanup(h, keep=policy is EndPolicy.KEEP_UNTIL_ACK)

    def _cleanup(self, h: Handover, *, keep: bool = False) -> None:
        """Everything the reservation's start made, undone (each step a no-op when done).

        ``keep``: an instance reservation's keep-until-ack end, whose stopped servers still hold
        their Placement allocations: only the project's access to the flavor and the aggregate
        go; the flavor, group and inventory stay until ``Acknowledge`` deletes the servers."""
        rid = h.reservation_id
        if h.resource_type == HOSTS:
            self._dissolve(rid)
        if h.resource_type != INSTANCES:
            return
        # Each part is undone even where another fails (Placement down must not leave Nova's
        # flavor and aggregate behind); the first failure is raised after all were tried.
        steps: list[Callable[[], None]] = [lambda: self._drop_flavor(h, keep=keep)]
        if not keep:
            steps += [lambda: self._drop_server_group(rid), lambda: self._drop_inventory(h)]
        steps.append(lambda: self._drop_aggregate(rid))
        failures: list[Exception] = []
        for step in steps:
            try:
                step()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _drop_flavor(self, h: Handover, *, keep: bool) -> None:
        flavor = self._find_flavor(h.reservation_id)
        if flavor is None:
            return
        try:
            self.conn.compute.flavor_remove_tenant_access(flavor, h.project_id)
        except Exception as exc:
            if "404" not in str(exc) and "not found" not in str(exc).lower():
                raise
        if not keep:
            self.conn.compute.delete_flavor(flavor, ignore_missing=True)

    def _drop_server_group(self, rid: str) -> None:
        for group in self.conn.compute.server_groups(all_projects=True):
            if group.name == f"{RESERVATION_PREFIX}:{rid}":
                self.conn.compute.delete_server_group(group, ignore_missing=True)

    def _drop_inventory(self, h: Handover) -> None:
        rc = resource_class(h.reservation_id)
        for host in sorted(set(_slots(h)) | self._holders(rc)):
            self._delete_inventory(host, rc)
        self._placement_delete(f"/resource_classes/{rc}")

    def _drop_aggregate(self, rid: str) -> None:
        aggregate = self._aggregate(rid)
        if aggregate is not None:
            for host in list(aggregate.hosts or []):
                aggregate = self.conn.compute.remove_host_from_aggregate(aggregate, host)
            self.conn.compute.delete_aggregate(aggregate, ignore_missing=True)

    # -- servers -------------------------------------------------------------------------------

    def _servers_of(self, h: Handover) -> Iterable[Any]:
        """The servers running on the reservation's capacity: on its hosts (host reservation)
        or of its flavor (instance reservation)."""
        if h.resource_type == INSTANCES:
            return [
                s
                for s in self.conn.compute.servers(all_projects=True)
                if flavor_id(s) == h.reservation_id
            ]
        hosts = set(h.hosts.values())
        return [s for s in self.conn.compute.servers(all_projects=True) if s.compute_host in hosts]

    def _kept(self, h: Handover) -> Iterable[Any]:
        """What a keep-until-ack end kept: the project's stopped servers on the capacity."""
        if h.resource_type == INSTANCES:
            return self._servers_of(h)
        return [s for s in self._servers_of(h) if s.project_id == h.project_id]

    def _delete_servers(self, servers: list[Any]) -> None:
        for server in servers:
            self.conn.compute.delete_server(server, ignore_missing=True)
        deadline = time.monotonic() + self.config.server_deletion_seconds
        for server in servers:
            while self._exists(server.id):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server {server.id} was not deleted in time")
                time.sleep(0.2)

    def _wait_for(self, servers: list[Any], statuses: frozenset[str]) -> None:
        """Until each server shows one of ``statuses`` (Nova's stop and shelve return before
        they are done; the hosts must not go back to the freepool before)."""
        deadline = time.monotonic() + self.config.server_deletion_seconds
        for server in servers:
            while (status := self.conn.compute.get_server(server.id).status) not in statuses:
                if status == "ERROR" or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"server {server.id} is {status}, not {'/'.join(sorted(statuses))}"
                    )
                time.sleep(0.2)

    def _exists(self, server_id: str) -> bool:
        from openstack.exceptions import NotFoundException

        try:
            self.conn.compute.get_server(server_id)
        except NotFoundException:
            return False
        return True

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
        reserved = self._rc_exists(rc)
        if reserved:
            self._set_inventory(move.to_name, rc, self._total(move.to_name, rc) + move.count)
        pool = self._aggregate(move.reservation_id)
        if pool is not None:
            self._move_in(pool, [move.to_name], leave_freepool=False)
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
            left = self._total(move.from_name, rc) - move.count
            if left > 0:
                self._set_inventory(move.from_name, rc, left)
                return
            self._delete_inventory(move.from_name, rc)
        pool = self._aggregate(move.reservation_id)
        if pool is not None and move.from_name in (pool.hosts or []):
            self.conn.compute.remove_host_from_aggregate(pool, move.from_name)

    # -- Placement -----------------------------------------------------------------------------

    def _placement_get(self, url: str) -> Any:
        response = self.conn.placement.get(url, microversion=PLACEMENT_MICROVERSION)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def _placement_put(self, url: str, body: object) -> Any:
        response = self.conn.placement.put(
            url, json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
        )
        if response.status_code >= 400:
            raise RuntimeError(f"Placement PUT {url}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def _placement_delete(self, url: str) -> None:
        response = self.conn.placement.delete(
            url, microversion=PLACEMENT_MICROVERSION, raise_exc=False
        )
        if response.status_code >= 400 and response.status_code != 404:
            raise RuntimeError(f"Placement DELETE {url}: {response.status_code} {response.text}")

    def _provider(self, name: str) -> dict[str, Any] | None:
        found = self._placement_get(f"/resource_providers?name={name}")
        providers = (found or {}).get("resource_providers", [])
        return dict(providers[0]) if providers else None

    def _child(self, host: str) -> dict[str, Any]:
        """The ``blazar_<host>`` provider under the compute's own one, made if missing."""
        child = self._provider(f"blazar_{host}")
        if child is not None:
            return child
        parent = self._provider(host)
        if parent is None:
            raise UnknownResource(f"Placement has no resource provider named {host!r}")
        response = self.conn.placement.post(
            "/resource_providers",
            json={"name": f"blazar_{host}", "parent_provider_uuid": parent["uuid"]},
            microversion=PLACEMENT_MICROVERSION,
            raise_exc=False,
        )
        if response.status_code >= 400 and response.status_code != 409:
            raise RuntimeError(f"Placement: {response.status_code} {response.text}")
        made = self._provider(f"blazar_{host}")
        if made is None:
            raise RuntimeError(f"Placement did not make provider blazar_{host}")
        return made

    def _make_resource_class(self, rc: str) -> None:
        """Custom resource class ``rc``, made if missing and then seen. Placement on MySQL may
        answer 204 ("exists") to a PUT that lost a race for the next class id to another one's:
        it reads the primary key's duplicate entry as the name's, and makes nothing."""
        for attempt in range(CONFLICT_ATTEMPTS):
            if attempt:
                time.sleep(random.uniform(0, 0.05 * attempt))
            self._placement_put(f"/resource_classes/{rc}", None)
            if self._rc_exists(rc):
                return
        raise RuntimeError(f"Placement did not make resource class {rc}")

    def _set_inventory(self, host: str, rc: str, total: int) -> None:
        for attempt in range(CONFLICT_ATTEMPTS):
            # A concurrent writer (another reservation's start, nova-compute) bumped the
            # provider's generation: read it again, after a short random pause. Placement may
            # also not know a resource class made a moment ago by this very start: each of its
            # threads caches the classes and refreshes the cache from its own snapshot of the
            # database, which under concurrent starts can predate the class (400).
            if attempt:
                time.sleep(random.uniform(0, 0.05 * attempt))
            child = self._child(host)
            base = f"/resource_providers/{child['uuid']}/inventories"
            body: dict[str, Any] = {
                "resource_provider_generation": child["generation"],
                "total": total,
            }
            if self._placement_get(f"{base}/{rc}") is None:
                response = self.conn.placement.post(
                    base,
                    json={**body, "resource_class": rc},
                    microversion=PLACEMENT_MICROVERSION,
                    raise_exc=False,
                )
            else:
                response = self.conn.placement.put(
                    f"{base}/{rc}", json=body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
                )
            if response.status_code == 400 and "No such resource class" in response.text:
                self._make_resource_class(rc)
                continue
            if response.status_code != 409:
                break
        if response.status_code >= 400:
            raise RuntimeError(f"Placement inventory {rc} on {host}: {response.text}")

    def _total(self, host: str, rc: str) -> int:
        child = self._provider(f"blazar_{host}")
        if child is None:
            return 0
        found = self._placement_get(f"/resource_providers/{child['uuid']}/inventories/{rc}")
        return int(found["total"]) if found else 0

    def _delete_inventory(self, host: str, rc: str) -> None:
        """The reservation's inventory on ``host`` removed. Placement refuses (409) while
        allocations use it: a deleted server's are released by its compute a moment after the
        server is gone from the API, so a refusal is tried again for a while."""
        child = self._provider(f"blazar_{host}")
        if child is None:
            return
        url = f"/resource_providers/{child['uuid']}/inventories/{rc}"
        deadline = time.monotonic() + self.config.server_deletion_seconds
        while True:
            response = self.conn.placement.delete(
                url, microversion=PLACEMENT_MICROVERSION, raise_exc=False
            )
            if response.status_code < 400 or response.status_code == 404:
                return
            if response.status_code != 409 or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Placement DELETE {url}: {response.status_code} {response.text}"
                )
            time.sleep(0.2)

    def _holders(self, rc: str) -> set[str]:
        """Hosts whose ``blazar_<host>`` provider has room of ``rc`` left: those the
        reservation holds, and any a heal left it on (a failed host's inventory, which its
        servers' allocations kept Placement from deleting then)."""
        if not self._rc_exists(rc):
            return set()
        found = self._placement_get(f"/resource_providers?resources={rc}:1")
        names = (p["name"] for p in (found or {}).get("resource_providers", []))
        return {n.removeprefix("blazar_") for n in names if n.startswith("blazar_")}

    def _rc_exists(self, rc: str) -> bool:
        return self._placement_get(f"/resource_classes/{rc}") is not None


def _slots(h: Handover) -> dict[str, int]:
    """Host name -> instance slots of an instance reservation (ids ``<host id>:<n>``)."""
    counts = Counter(r.partition(":")[0] for r in h.resource_ids)
    return {h.hosts[host_id]: n for host_id, n in counts.items() if host_id in h.hosts}


def _service_state(service: Mapping[str, Any]) -> HostState:
    if service.get("status") == "disabled" and str(service.get("disabled_reason") or "").startswith(
        POWER_REASON
    ):
        return HostState(True)  # asleep by the power policy, whatever its heartbeat says
    if service.get("forced_down"):
        return HostState(False, "nova: forced down")
    if service.get("status") == "disabled":
        why = "".join(c for c in str(service.get("disabled_reason") or "") if c.isprintable())
        return HostState(False, f"nova: disabled ({why[:200]})" if why else "nova: disabled")
    if service.get("state") != "up":
        return HostState(False, "nova: down")
    return HostState(True)
