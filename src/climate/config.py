"""Settings: one object, read once at the entry point from TOML and ``CLIMATE_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from climate.addresses import (
    redact,
    sink_keys,
    transport_url_problem,
    validate_webhook_urls,
    webhook_url_problem,
)
from climate.config_input import problem, read_file
from climate.domain.flavors import parse_flavors
from climate.errors import InvalidInput
from climate.fairshare.rule_config import parse_rules, parsed

if TYPE_CHECKING:
    from climate.fairshare.rules import Rule

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

Seconds = Annotated[float, Field(gt=0)]


class Settings(BaseSettings):
    """Everything an operator can set. Explicit overrides beat environment beat file beat default.

    Build it with :func:`load_settings`, which names the variable or file of any bad value; derive
    a variant with ``settings.model_copy(update={...})``."""

    model_config = SettingsConfigDict(
        env_prefix="CLIMATE_", frozen=True, extra="forbid", allow_inf_nan=False
    )

    data_dir: str = str(Path.home() / ".local" / "share" / "climate")
    database_url: str = ""
    bind_host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(1234, ge=1, le=65535)
    auth: Literal["noauth", "token", "keystone"] = "noauth"
    allow_noauth_public: bool = False
    default_project_id: str = Field("admin", min_length=1)
    default_user_id: str = Field("admin", min_length=1)
    admin_role: str = Field("admin", min_length=1)
    backend: str = Field("standalone", min_length=1)
    minutes_before_end_lease: int = Field(60, ge=0)
    webhooks: Annotated[tuple[str, ...], NoDecode] = ()
    webhook_secret: str = ""
    webhook_timeout_seconds: Seconds = 5.0
    webhook_max_attempts: int = Field(10, ge=1)
    webhook_concurrency: int = Field(8, ge=1)
    notification_transport_url: str = ""
    """Where bus notifications go (oslo.messaging, e.g. ``rabbit://user:pass@host:5672/``);
    empty: none are sent."""
    notification_topics: Annotated[tuple[str, ...], NoDecode, Field(min_length=1)] = (
        "notifications",
    )
    notification_driver: Literal["messagingv2", "messaging"] = "messagingv2"
    notification_publisher_id: str = Field("blazar.lease", min_length=1)
    notification_timeout_seconds: float = Field(5.0, gt=0, le=300)
    event_max_attempts: int = Field(3, ge=1)
    event_retry_base_seconds: float = Field(1.0, ge=0)
    event_claim_seconds: Seconds = 120.0
    manager_heartbeat_seconds: Seconds = 1.0
    manager_dead_seconds: Seconds = 5.0
    """A manager whose heartbeat is older than this is dead: its claims may be taken over."""
    backend_timeout_seconds: Seconds = 30.0
    fault_rate: float = Field(0.0, ge=0, le=1)
    fault_hang_rate: float = Field(0.0, ge=0, le=1)
    fault_seed: int = 0
    max_body_bytes: int = Field(1_048_576, ge=1)
    max_page_size: int = Field(1000, ge=1)
    request_slots: int = Field(1, ge=1, le=40)
    """Requests one API process works on at once; more wait, changes first (api/scheduling.py)."""
    request_lend_ms: float = Field(50.0, gt=0)
    """A request running this long lets one more in beside it."""
    request_max_wait_ms: float = Field(500.0, gt=0)
    """A read waiting this long goes before cheaper reads that came after it."""
    availability_max_days: int = Field(400, ge=1)
    offer_search_days: int = Field(30, ge=1)
    reoptimise_budget_ms: float = Field(5.0, ge=0)
    """How long admission may search for moves of pending leases once the search has grown past
    a small one (docs/planning.md); 0: only its step budget bounds it."""
    policy_file: str = ""
    max_wait_seconds: Seconds = 30.0
    cpu_allocation_ratio: float = Field(1.0, gt=0)
    ram_allocation_ratio: float = Field(1.0, gt=0)
    disk_allocation_ratio: float = Field(1.0, gt=0)
    immediate_wait_seconds: float = Field(5.0, ge=0)
    retry_max_attempts: int = Field(5, ge=1)
    retry_interval_seconds: Seconds = 60.0
    queue_poll_seconds: Seconds = 5.0
    heal_interval_seconds: float = Field(60.0, ge=0)
    """A host that went down less than this long ago is not used to heal reservations (a
    flapping host pulls none back and forth); the manager also looks this often for
    reservations still to heal (docs/healing.md)."""
    nova_poll_seconds: Seconds = 5.0
    """How often the manager asks the backend (Nova's os-services) which hosts are down,
    forced down or disabled (manager/monitor.py); Blazar's ``polling_interval`` is 60 s."""
    nova_transport_url: str = ""
    """oslo.messaging transport on which Nova publishes versioned notifications (Nova's
    ``[oslo_messaging_notifications] driver = messagingv2``): each ``service.update`` of a
    compute makes the monitor look at once. Empty: polling only."""
    nova_notification_topic: str = "versioned_notifications"
    openstack_concurrency: int = Field(8, ge=1, le=64)
    """With ``backend = "openstack"``: how many reservations of one start or end are made (or
    taken back) in Nova and Placement at once."""
    heal_horizon_seconds: float = Field(3600.0, ge=0)
    """Reservations on a failed host that start within this long are healed at once, later ones
    when they come this close (0: all at once); Blazar's ``healing_interval``."""
    power_policy: Literal["off", "report", "act"] = "off"
    """Hosts with no allocation within ``power_idle_hours``: ``report`` lists them
    (``GET /v1/power``), ``act`` also powers them down through the backend and wakes them
    ``power_wake_lead_seconds`` ahead of their next lease (docs/power.md)."""
    power_idle_hours: float = Field(4.0, gt=0, le=24 * 366)
    power_wake_lead_seconds: float = Field(600.0, ge=0)
    power_interval_seconds: float = Field(60.0, gt=0)
    """How often the manager looks for hosts to power down or wake."""
    power_host_watts: float = Field(300.0, ge=0)
    """What an idle host draws while on: the savings report's kWh."""
    idle_reclaim: bool = False
    """Release leases nobody uses (docs/idle.md): a warning after ``idle_warning_hours`` without
    a sign of use, the lease ended after ``idle_release_hours``. Off: nothing is probed."""
    idle_warning_hours: float = Field(24.0, gt=0, le=24 * 366)
    idle_release_hours: float = Field(48.0, gt=0, le=24 * 366)
    idle_interval_seconds: Seconds = 300.0
    """How often the manager asks the backend whether running leases are in use."""
    idle_resource_types: Annotated[tuple[str, ...], NoDecode, Field(min_length=1)] = (
        "physical:host",
        "virtual:instance",
    )
    """Leases with a reservation of one of these types are watched; the others never idle."""
    idle_exempt_projects: Annotated[tuple[str, ...], NoDecode] = ()
    """Projects whose leases are never warned nor released for idleness."""
    hold_max_seconds: int = Field(86_400, ge=1)
    flavors: str = (
        "m1.tiny=1:512:1,m1.small=1:2048:20,m1.medium=2:4096:40,m1.large=4:8192:80,"
        "m1.xlarge=8:16384:160"
    )
    """Heat flavors a stack template may name, ``name=vcpus:memory_mb:disk_gb`` by commas."""
    header_timeout_seconds: Seconds = 10.0
    """A connection must send a request's complete headers within this long of starting it."""
    body_timeout_seconds: Seconds = 30.0
    """...and its complete body within this long of the headers."""
    max_connections: int = Field(1000, ge=1)
    """Open connections (per API process) beyond which new ones are answered 503 and closed."""
    freepool_name: str = Field("freepool", min_length=1)
    blazar_az_prefix: str = Field("blazar_", min_length=1)
    blazar_owner: str = Field("blazar:owner", min_length=1)
    project_id_key: str = Field("blazar:project", min_length=1)
    """Blazar's names on the Nova side (its ``[nova]`` and ``[physical:host]`` options)."""
    # The service user (auth = "keystone" and the openstack backend), under the names the
    # ``openstack`` command reads: each also comes from its ``OS_*`` variable (OS_AUTH_URL, ...);
    # ``os_cloud`` names a cloud of a clouds.yaml whose entries the others override
    # (docs/keystone.md).
    os_cloud: str = ""
    os_client_config_file: str = ""
    os_auth_type: str = ""
    os_auth_url: str = ""
    os_username: str = ""
    os_user_id: str = ""
    os_password: str = ""
    os_project_name: str = ""
    os_project_id: str = ""
    os_user_domain_name: str = ""
    os_user_domain_id: str = ""
    os_project_domain_name: str = ""
    os_project_domain_id: str = ""
    os_application_credential_id: str = ""
    os_application_credential_name: str = ""
    os_application_credential_secret: str = ""
    os_region_name: str = ""
    os_interface: str = ""
    keystone_www_authenticate_uri: str = ""
    """The Keystone address clients are told to authenticate at (401s); default: the auth URL."""
    usage_rules: tuple[dict[str, Any], ...] = ()
    """Usage rules checked at admission: the ``[[climate.usage_rules]]`` tables of the config
    file (docs/fair-share.md); each is checked at start-up."""
    usage_gpu_property: str = Field("gpu_count", min_length=1)
    """The host property that says how many GPUs a host has (hosts without it have none)."""
    external_service_base_endpoint: str = ""
    """Blazar's ExternalServiceFilter: POST ``check-create``, ``check-update`` and ``on-end``
    under this URL; each can be replaced by its own setting below. Empty: no external hook."""
    external_service_check_create_endpoint: str = ""
    external_service_check_update_endpoint: str = ""
    external_service_on_end_endpoint: str = ""
    external_service_token: str = ""
    """Sent as ``X-Auth-Token`` to the external service, as Blazar does."""
    external_service_timeout_seconds: float = Field(5.0, gt=0, le=60)
    external_service_fail_open: bool = False
    """An external service that times out or answers something else than 204 or 403: admit
    (true) or refuse (false, the default). Either way it is logged."""
    keystone_token_cache_seconds: int = Field(300, ge=-1)
    """How long a validated token is trusted without asking Keystone again (keystonemiddleware's
    ``token_cache_time``; -1 asks Keystone every time): a revoked token keeps working that long."""
    # Operations (docs/operations.md).
    ready_max_outbox_backlog: int = Field(10_000, ge=0)
    """``/readyz`` fails (503, ``outbox``) while more notifications than this wait undelivered."""
    metrics_dir: str = ""
    """A directory where every Climate process of this machine keeps its Prometheus counters
    (prometheus-client's multiprocess mode), so that ``/metrics`` of any API process shows them
    all, the manager's included. Empty: ``climate api --workers N`` uses a private temporary one;
    ``climate serve`` keeps them in memory (one process)."""
    metrics_show_projects: bool = False
    """``/metrics`` also counts leases per project (``climate_project_leases``): project ids."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line (``ts``, ``level``, ``logger``, ``message``, and
    the access log's fields)."""
    access_log: bool = True
    """One line per HTTP request (logger ``climate.access``): method, path, route, status, time."""
    prices: dict[str, str] = Field(default_factory=dict)
    """The price table (``climate.pricing``, docs/usage.md): price per unit-hour by resource
    type (``"physical:host" = "1.20"``) or premium by property (``"physical:host[gpu=a100]"``)."""
    usage_max_days: int = Field(400, ge=1)
    """Longest custom period a usage report may cover."""
    credits: bool = False
    """Credits (docs/credits.md): each lease's quote by the price table is encumbered from its
    project's balance at admission and settled at its end; a project that cannot cover a quote
    is refused (403). Off: nothing is priced at admission."""
    credits_factor_property: str = Field("su_factor", min_length=1, max_length=255)
    """The resource property that multiplies its price in a credits quote (default 1)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings layers the file, the environment and overrides itself, to name the source
        # of a bad value; Settings(...) on its own reads nothing else.
        return (init_settings,)

    @field_validator(
        "webhooks",
        "notification_topics",
        "idle_resource_types",
        "idle_exempt_projects",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, raw: object) -> object:
        if isinstance(raw, str):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return raw

    @field_validator("manager_dead_seconds")
    @classmethod
    def _dead_after_heartbeats(cls, seconds: float, info: ValidationInfo) -> float:
        heartbeat = info.data.get("manager_heartbeat_seconds")
        if heartbeat is not None and seconds < 2 * heartbeat:
            raise ValueError(
                f"must be at least twice manager_heartbeat_seconds ({heartbeat:g}), not {seconds:g}"
            )
        return seconds

    @field_validator("power_interval_seconds")
    @classmethod
    def _power_wakes_in_time(cls, seconds: float, info: ValidationInfo) -> float:
        idle, lead = info.data.get("power_idle_hours"), info.data.get("power_wake_lead_seconds")
        if idle is not None and lead is not None and idle * 3600.0 <= lead + seconds:
            # A host powered down would have to wake before the next look at it.
            raise ValueError(
                f"power_idle_hours ({idle:g} h) must be longer than power_wake_lead_seconds "
                f"({lead:g}) plus power_interval_seconds ({seconds:g})"
            )
        return seconds

    @field_validator("idle_release_hours")
    @classmethod
    def _release_after_warning(cls, hours: float, info: ValidationInfo) -> float:
        warning = info.data.get("idle_warning_hours")
        if warning is not None and hours <= warning:
            # The warning must come first, with time left to act on it.
            raise ValueError(
                f"must be longer than idle_warning_hours ({warning:g} h), not {hours:g} h"
            )
        return hours

    @field_validator("idle_resource_types", "idle_exempt_projects")
    @classmethod
    def _names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in names if any(c.isspace() or not c.isprintable() for c in n)]
        if bad:
            raise ValueError("names without spaces, not " + ", ".join(map(repr, bad)))
        return names

    @field_validator("webhooks")
    @classmethod
    def _webhook_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        try:
            validate_webhook_urls(urls)
        except InvalidInput as exc:
            raise ValueError(exc.message.removeprefix("webhooks: ")) from exc
        return urls

    @field_validator("notification_topics")
    @classmethod
    def _topic_names(cls, topics: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in topics if not t or any(c.isspace() or not c.isprintable() for c in t)]
        if bad:
            raise ValueError("topics are names without spaces, not " + ", ".join(map(repr, bad)))
        return topics

    @field_validator("notification_transport_url")
    @classmethod
    def _transport_url(cls, url: str) -> str:
        if not url:
            return url
        problem = transport_url_problem(url)
        if problem is not None:
            raise ValueError(f"not an oslo.messaging transport URL: {redact(url)!r}: {problem}")
        return url

    @property
    def notification_sinks(self) -> tuple[str, ...]:
        """Where each notification goes: every webhook URL, each bus topic (``bus:<topic>``)
        when there is a transport URL, and the external service's ``on-end`` endpoint (only
        told of ends: docs/fair-share.md)."""
        from climate.fairshare.external import endpoint

        bus = sink_keys(self.notification_topics) if self.notification_transport_url else ()
        on_end = endpoint(self, "on-end")
        return self.webhooks + bus + ((on_end,) if on_end else ())

    @field_validator("usage_rules")
    @classmethod
    def _usage_rules(cls, raw: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        parse_rules(raw)  # a RuleError is a ValueError naming the rule
        return raw

    @property
    def rules(self) -> tuple[Rule, ...]:
        """``usage_rules`` parsed (they were checked when the settings were built)."""
        return parsed(self.usage_rules)

    @field_validator(
        "external_service_base_endpoint",
        "external_service_check_create_endpoint",
        "external_service_check_update_endpoint",
        "external_service_on_end_endpoint",
    )
    @classmethod
    def _external_url(cls, url: str) -> str:
        problem = webhook_url_problem(url) if url else None
        if problem is not None:
            raise ValueError(f"not an http(s) URL: {url!r}: {problem}")
        return url

    @field_validator("prices")
    @classmethod
    def _price_table(cls, prices: dict[str, str]) -> dict[str, str]:
        from climate.pricing import PriceTable

        try:
            PriceTable.parse(prices)
        except InvalidInput as exc:
            raise ValueError(exc.message) from exc
        return prices

    @field_validator("flavors")
    @classmethod
    def _known_flavors(cls, text: str) -> str:
        try:
            parse_flavors(text)
        except InvalidInput as exc:
            raise ValueError(exc.message.removeprefix("flavors: ")) from exc
        return text

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.data_dir) / 'climate.db'}"

    def check_bind(self, host: str, force: bool = False) -> None:
        """Refuse to serve noauth on a public address unless explicitly forced."""
        if self.auth == "noauth" and host not in LOOPBACK_HOSTS:
            if not (force or self.allow_noauth_public):
                raise InvalidInput(
                    "bind_host",
                    f"noauth mode may only listen on loopback, not {host}; "
                    "use auth = 'token' or force it with --allow-noauth-public",
                )


class _Environment(EnvSettingsSource):
    """``CLIMATE_*`` variables from a given mapping rather than always ``os.environ``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._given, False, False, None)

    def keys(self) -> dict[str, str]:
        """Each setting found, with the variable it came from."""
        return {
            name: f"CLIMATE_{name.upper()}"
            for name in Settings.model_fields
            if f"CLIMATE_{name.upper()}" in self._given
        }


def load_settings(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    """Build settings from an optional TOML file, the environment and explicit overrides.

    ``env`` defaults to ``os.environ``; ``{}`` means no environment. Every error names the
    setting as it was given: ``CLIMATE_PORT: must be an integer, not 'abc'``.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    origin: dict[str, str] = {}
    file_path = path or env.get("CLIMATE_CONFIG")
    if file_path:
        table = read_file(file_path)
        values.update(table)
        origin.update({name: f"{name} in {file_path}" for name in table})
    for name in Settings.model_fields:
        if name.startswith("os_") and name.upper() in env:
            values[name] = env[name.upper()]
            origin[name] = name.upper()
    environment = _Environment(env)
    values.update(environment())
    origin.update(environment.keys())
    given = {name: value for name, value in overrides.items() if value is not None}
    values.update(given)
    origin.update({name: name for name in given})
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "config"
        raise InvalidInput(origin.get(name, name), problem(first)) from None
    if settings.auth == "keystone":
        from climate.keystone import service_credentials

        service_credentials(settings)  # a missing one stops start-up, named
    return settings
