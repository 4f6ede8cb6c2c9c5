"""The service user Climate talks to Keystone (and the rest of the cloud) as, under the names the
``openstack`` command reads: ``OS_*`` variables or ``os_*`` settings, or a cloud of a clouds.yaml
(``OS_CLOUD``) whose entries the explicit ones override, as ``openstack --os-password`` does.

``auth = "keystone"`` checks these settings when they are loaded (a missing one stops start-up,
named) and logs the service user in once when the API starts (a wrong one stops it, named)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from climate.errors import InvalidInput

if TYPE_CHECKING:
    from climate.config import Settings

PASSWORD = frozenset({"password", "v3password"})
APPLICATION_CREDENTIAL = frozenset({"applicationcredential", "v3applicationcredential"})
CONNECT_RETRIES = 3
"""Sends again of a request whose connection failed: an API server drops an idle keep-alive
connection as the next request goes out on it (gunicorn after 2 s), which is no outage."""
_PASSWORD_KEYS: tuple[str, ...] = (
    "auth_url",
    "username",
    "user_id",
    "password",
    "user_domain_name",
    "user_domain_id",
    "project_name",
    "project_id",
    "project_domain_name",
    "project_domain_id",
)
# An application credential carries its project: Keystone refuses a scope beside it.
_APPLICATION_CREDENTIAL_KEYS: tuple[str, ...] = (
    "auth_url",
    "application_credential_id",
    "application_credential_name",
    "application_credential_secret",
    "username",
    "user_id",
    "user_domain_name",
    "user_domain_id",
)


@dataclass(frozen=True)
class ServiceCredentials:
    """A keystoneauth plugin name and its options, as keystonemiddleware and openstacksdk take
    them (``openstack.connect(auth_type=..., auth=..., region_name=...)``)."""

    auth_type: str
    auth: dict[str, str] = field(default_factory=dict)
    region_name: str = ""
    interface: str = ""


def _name(key: str) -> str:
    """How an operator spells a key: the variable and the setting."""
    return f"OS_{key.upper()} ({'os_' + key})"


def _from_cloud(cloud: str, config_file: str) -> tuple[str, dict[str, str], str, str]:
    from openstack import exceptions as sdk_exceptions
    from openstack import warnings as sdk_warnings
    from openstack.config import loader

    # Not the SDK's own OS_* reading: the settings already hold those, and they override.
    files = [config_file, *loader.CONFIG_FILES] if config_file else None
    try:
        with warnings.catch_warnings():  # the SDK's notes to its own users (InfluxDB, ...)
            warnings.simplefilter("ignore", sdk_warnings.RemovedInSDK60Warning)
            loaded = loader.OpenStackConfig(config_files=files, load_envvars=False)
            region = loaded.get_one(cloud=cloud)
    except sdk_exceptions.SDKException as exc:
        raise InvalidInput(_name("cloud"), f"cannot use cloud {cloud!r}: {exc}") from None
    config = region.config
    auth = {k: str(v) for k, v in (config.get("auth") or {}).items() if v}
    return (
        str(config.get("auth_type") or ""),
        auth,
        str(config.get("region_name") or ""),
        str(config.get("interface") or ""),
    )


def service_credentials(settings: Settings) -> ServiceCredentials:
    """The service user's credentials.

    :raises InvalidInput: one is missing or the cloud cannot be read; names the variable."""
    auth_type, region, interface = "", "", ""
    auth: dict[str, str] = {}
    if settings.os_cloud:
        auth_type, auth, region, interface = _from_cloud(
            settings.os_cloud, settings.os_client_config_file
        )
    auth_type = settings.os_auth_type or auth_type or "password"
    if auth_type in PASSWORD:
        keys = _PASSWORD_KEYS
    elif auth_type in APPLICATION_CREDENTIAL:
        keys = _APPLICATION_CREDENTIAL_KEYS
    else:
        raise InvalidInput(
            _name("auth_type"),
            f"must be 'password' or 'v3applicationcredential' for auth = 'keystone', "
            f"not {auth_type!r}",
        )
    for key in keys:
        value = getattr(settings, f"os_{key}")
        if value:
            auth[key] = value
    auth = {k: v for k, v in auth.items() if k in keys}

    def need(*alternatives: str) -> None:
        if not any(auth.get(k) for k in alternatives):
            names = " or ".join(_name(k) for k in alternatives)
            raise InvalidInput(names, "required for auth = 'keystone' (the service user)")

    need("auth_url")
    if auth_type in PASSWORD:
        need("username", "user_id")
        need("password")
        need("project_name", "project_id")
        if auth.get("username"):
            need("user_domain_name", "user_domain_id")
        if auth.get("project_name"):
            need("project_domain_name", "project_domain_id")
    else:
        need("application_credential_secret")
        need("application_credential_id", "application_credential_name")
        if not auth.get("application_credential_id"):
            need("username", "user_id")
            if auth.get("username"):
                need("user_domain_name", "user_domain_id")
    return ServiceCredentials(
        auth_type,
        auth,
        settings.os_region_name or region,
        settings.os_interface or interface,
    )


def log_in(credentials: ServiceCredentials, timeout: float) -> None:
    """Gets the service user a token once, so that wrong credentials stop start-up.

    :raises InvalidInput: Keystone cannot be reached or refuses them; names the settings."""
    from keystoneauth1 import exceptions as ksa_exceptions
    from keystoneauth1 import loading, session
    from keystoneauth1.plugin import BaseAuthPlugin

    loader: loading.BaseLoader[BaseAuthPlugin] = loading.get_plugin_loader(credentials.auth_type)
    auth = loader.load_from_options(**credentials.auth)
    url = credentials.auth["auth_url"]
    try:
        session.Session(auth=auth, timeout=timeout, connect_retries=CONNECT_RETRIES).get_token()
    except (ksa_exceptions.ConnectFailure, ksa_exceptions.DiscoveryFailure) as exc:
        raise InvalidInput(_name("auth_url"), f"cannot reach Keystone at {url}: {exc}") from None
    except ksa_exceptions.Unauthorized:
        who = " / ".join(_name(k) for k in credentials.auth if k != "auth_url")
        secret = "password" if credentials.auth_type in PASSWORD else "secret"
        raise InvalidInput(
            who,
            f"Keystone at {url} refused the service user (wrong name, {secret}, project or domain)",
        ) from None
    except ksa_exceptions.ClientException as exc:
        raise InvalidInput(_name("auth_url"), f"Keystone at {url} answered: {exc}") from None


def trust_scoped(credentials: ServiceCredentials, trust_id: str) -> dict[str, str] | None:
    """The service user's ``auth`` options scoped to ``trust_id`` instead of its project (a trust
    carries its own project); None for an application credential, which cannot use a trust."""
    if credentials.auth_type not in PASSWORD:
        return None
    auth = {k: v for k, v in credentials.auth.items() if not k.startswith("project_")}
    auth["trust_id"] = trust_id
    return auth


class Trusts:
    """Keystone trusts from a lessee to the service user, as Blazar makes one for each lease
    (``blazar.utils.trusts.create_trust``): impersonation, the lessee's roles on the lease's
    project. Through it the backend acts in the lessee's project where Nova scopes a thing to
    the project that made it (an instance reservation's server group, which the lessee then
    names in a ``group`` scheduler hint)."""

    def __init__(self, credentials: ServiceCredentials, timeout: float) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self._service: Any = None

    def _endpoint(self) -> dict[str, Any]:
        where: dict[str, Any] = {"service_type": "identity", "version": (3, 0)}
        if self.credentials.interface:
            where["interface"] = self.credentials.interface
        if self.credentials.region_name:
            where["region_name"] = self.credentials.region_name
        return where

    def _service_session(self) -> Any:
        if self._service is None:
            from keystoneauth1 import loading, session
            from keystoneauth1.plugin import BaseAuthPlugin

            loader: loading.BaseLoader[BaseAuthPlugin] = loading.get_plugin_loader(
                self.credentials.auth_type
            )
            auth = loader.load_from_options(**self.credentials.auth)
            self._service = session.Session(
                auth=auth, timeout=self.timeout, connect_retries=CONNECT_RETRIES
            )
        return self._service

    def create(self, token: str, user_id: str, project_id: str, roles: Iterable[str]) -> str:
        """A trust from the token's user to the service user on ``project_id``; its id.

        :raises keystoneauth1.exceptions.ClientException: Keystone refused or cannot be reached.
        """
        from keystoneauth1 import session
        from keystoneauth1.identity import v3

        trustee = self._service_session().get_user_id()
        lessee = session.Session(
            auth=v3.Token(
                auth_url=self.credentials.auth["auth_url"], token=token, project_id=project_id
            ),
            timeout=self.timeout,
            connect_retries=CONNECT_RETRIES,
        )
        body = {
            "trust": {
                "trustor_user_id": user_id,
                "trustee_user_id": trustee,
                "project_id": project_id,
                "impersonation": True,
                "roles": [{"name": role} for role in sorted(roles)],
            }
        }
        answer = lessee.post("/OS-TRUST/trusts", json=body, endpoint_filter=self._endpoint())
        return str(answer.json()["trust"]["id"])

    def delete(self, trust_id: str) -> None:
        """Drop the trust (gone already: nothing to do).

        :raises keystoneauth1.exceptions.ClientException: Keystone refused or cannot be reached.
        """
        from keystoneauth1 import exceptions as ksa_exceptions

        try:
            self._service_session().delete(
                f"/OS-TRUST/trusts/{trust_id}", endpoint_filter=self._endpoint()
            )
        except ksa_exceptions.NotFound:
            pass
