"""How the openstack backend reaches the cloud: a service user's credentials, as the
``openstack`` client reads them (``OS_*`` variables, or ``OS_CLOUD`` and a clouds.yaml), or the
same keys in Climate's config file (``os_auth_url``, ``os_username``, ...; the file wins); and
Blazar's names on the Nova side."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from climate.config import Settings
from climate.errors import InvalidInput

CREDENTIALS = (
    "auth_url",
    "username",
    "password",
    "project_name",
    "project_id",
    "user_domain_name",
    "user_domain_id",
    "project_domain_name",
    "project_domain_id",
    "application_credential_id",
    "application_credential_secret",
)
"""Keystone credential keys: ``os_<key>`` settings, ``OS_<KEY>`` variables."""


@dataclass(frozen=True)
class CloudConfig:
    cloud: str = ""
    """A clouds.yaml entry (``os_cloud`` / ``OS_CLOUD``), used when no ``os_auth_url`` is set."""
    auth: Mapping[str, str] = field(default_factory=dict)
    region_name: str = ""
    freepool_name: str = "freepool"
    az_prefix: str = "blazar_"
    owner_key: str = "blazar:owner"
    project_id_key: str = "blazar:project"
    server_deletion_seconds: float = 20.0
    """How long an end waits for the servers it deleted to be gone from the hosts."""

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str] | None = None) -> CloudConfig:
        """The settings, with the ``OS_*`` variables for what they leave empty.

        :raises InvalidInput: a credential is missing, naming the setting and the variable.
        """
        env = os.environ if env is None else env

        def value(key: str) -> str:
            return str(getattr(settings, f"os_{key}") or env.get(f"OS_{key.upper()}", ""))

        auth = {key: value(key) for key in CREDENTIALS if value(key)}
        cloud = value("cloud")
        config = cls(
            cloud=cloud,
            auth=auth,
            region_name=value("region_name"),
            freepool_name=settings.freepool_name,
            az_prefix=settings.blazar_az_prefix,
            owner_key=settings.blazar_owner,
            project_id_key=settings.project_id_key,
        )
        config.check()
        return config

    def check(self) -> None:
        """:raises InvalidInput: naming the first missing setting."""
        if not self.freepool_name:
            raise InvalidInput("freepool_name", "the freepool aggregate needs a name")
        if "auth_url" not in self.auth:
            if self.cloud:
                return
            raise InvalidInput(
                "os_auth_url",
                "the openstack backend needs the service user's credentials: set OS_AUTH_URL "
                "(or os_auth_url in the config file), or OS_CLOUD with a clouds.yaml",
            )
        if "application_credential_id" in self.auth:
            if "application_credential_secret" not in self.auth:
                raise InvalidInput(
                    "os_application_credential_secret",
                    "missing (OS_APPLICATION_CREDENTIAL_SECRET) for the application credential",
                )
            return
        for key in ("username", "password"):
            if key not in self.auth:
                raise InvalidInput(
                    f"os_{key}", f"missing: set OS_{key.upper()} or os_{key} in the config file"
                )
        if "project_name" not in self.auth and "project_id" not in self.auth:
            raise InvalidInput(
                "os_project_name",
                "missing: set OS_PROJECT_NAME (or OS_PROJECT_ID), or os_project_name",
            )
