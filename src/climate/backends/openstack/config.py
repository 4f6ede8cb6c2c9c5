"""How the openstack backend reaches the cloud: the service user's credentials
(``climate.keystone.service_credentials``: ``OS_*`` variables, ``os_*`` settings or a cloud of a
clouds.yaml, the same ones ``auth = "keystone"`` uses) and Blazar's names on the Nova side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from climate.config import Settings
from climate.errors import InvalidInput
from climate.keystone import CONNECT_RETRIES, ServiceCredentials, service_credentials


@dataclass(frozen=True)
class CloudConfig:
    credentials: ServiceCredentials
    freepool_name: str = "freepool"
    az_prefix: str = "blazar_"
    owner_key: str = "blazar:owner"
    project_id_key: str = "blazar:project"
    server_deletion_seconds: float = 20.0
    """How long an end waits for the servers it deleted to be gone from the hosts."""
    nova_transport_url: str = ""
    """Where Nova publishes its versioned notifications (oslo.messaging); empty: not heard."""
    nova_notification_topic: str = "versioned_notifications"
    concurrency: int = 8
    """Reservations of one start or end made in Nova and Placement at once."""

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudConfig:
        """:raises InvalidInput: a credential or name is missing, naming the setting."""
        if not settings.freepool_name:
            raise InvalidInput("freepool_name", "the freepool aggregate needs a name")
        return cls(
            credentials=service_credentials(settings),
            freepool_name=settings.freepool_name,
            az_prefix=settings.blazar_az_prefix,
            owner_key=settings.blazar_owner,
            project_id_key=settings.project_id_key,
            nova_transport_url=settings.nova_transport_url,
            nova_notification_topic=settings.nova_notification_topic,
            concurrency=settings.openstack_concurrency,
        )


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
