"""How the openstack backend reaches the cloud: the service user's credentials
(``climate.keystone.service_credentials``: ``OS_*`` variables, ``os_*`` settings or a cloud of a
clouds.yaml, the same ones ``auth = "keystone"`` uses) and Blazar's names on the Nova side."""

from __future__ import annotations

from dataclasses import dataclass

from climate.config import Settings
from climate.errors import InvalidInput
from climate.keystone import ServiceCredentials, service_credentials


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
