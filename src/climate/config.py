"""Settings: one object, read once at the entry point from TOML and ``CLIMATE_*`` variables."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from climate.errors import InvalidInput
from climate.services.templates import parse_flavors

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything an operator can set. Environment beats file beats default."""

    data_dir: str = str(Path.home() / ".local" / "share" / "climate")
    database_url: str = ""
    bind_host: str = "127.0.0.1"
    port: int = 1234
    auth: str = "noauth"
    allow_noauth_public: bool = False
    default_project_id: str = "admin"
    default_user_id: str = "admin"
    admin_role: str = "admin"
    backend: str = "standalone"
    minutes_before_end_lease: int = 60
    webhooks: tuple[str, ...] = ()
    webhook_secret: str = ""
    webhook_timeout_seconds: float = 5.0
    webhook_max_attempts: int = 10
    webhook_concurrency: int = 8
    event_max_attempts: int = 3
    event_retry_base_seconds: float = 1.0
    event_claim_seconds: float = 120.0
    backend_timeout_seconds: float = 30.0
    fault_rate: float = 0.0
    fault_hang_rate: float = 0.0
    fault_seed: int = 0
    max_body_bytes: int = 1_048_576
    max_page_size: int = 1000
    availability_max_days: int = 400
    offer_search_days: int = 30
    policy_file: str = ""
    max_wait_seconds: float = 30.0
    cpu_allocation_ratio: float = 1.0
    ram_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0
    immediate_wait_seconds: float = 5.0
    retry_max_attempts: int = 5
    retry_interval_seconds: float = 60.0
    queue_poll_seconds: float = 5.0
    hold_max_seconds: int = 86_400
    flavors: str = (
        "m1.tiny=1:512:1,m1.small=1:2048:20,m1.medium=2:4096:40,m1.large=4:8192:80,"
        "m1.xlarge=8:16384:160"
    )
    """Heat flavors a stack template may name, ``name=vcpus:memory_mb:disk_gb`` by commas."""

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


def _coerce(field: dataclasses.Field[Any], raw: object) -> object:
    kind = field.type
    if kind in ("int", int):
        return int(str(raw))
    if kind in ("float", float):
        return float(str(raw))
    if kind in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        return str(raw).strip().lower() in {"1", "true", "yes", "on"}
    if str(kind).startswith("tuple"):
        if isinstance(raw, list | tuple):
            return tuple(str(v) for v in raw)
        return tuple(v.strip() for v in str(raw).split(",") if v.strip())
    return str(raw)


def load_settings(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    """Build settings from an optional TOML file, the environment and explicit overrides."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    file_path = path or env.get("CLIMATE_CONFIG")
    if file_path:
        with open(file_path, "rb") as handle:
            values.update(tomllib.load(handle).get("climate", {}))
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name in fields:
        key = f"CLIMATE_{name.upper()}"
        if key in env:
            values[name] = env[key]
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(fields)
    if unknown:
        raise InvalidInput("config", f"unknown settings: {', '.join(sorted(unknown))}")
    try:
        coerced = {name: _coerce(fields[name], raw) for name, raw in values.items()}
    except ValueError as exc:
        raise InvalidInput("config", str(exc)) from exc
    settings = Settings(**coerced)  # type: ignore[arg-type]
    if settings.auth not in {"noauth", "token"}:
        raise InvalidInput("auth", f"must be 'noauth' or 'token', not {settings.auth!r}")
    if settings.max_page_size < 1:
        raise InvalidInput("max_page_size", f"must be at least 1, not {settings.max_page_size}")
    for ratio in ("cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio"):
        if not getattr(settings, ratio) > 0:
            raise InvalidInput(ratio, f"must be a number above 0, not {getattr(settings, ratio)}")
    if settings.webhook_concurrency < 1:
        raise InvalidInput(
            "webhook_concurrency", f"must be at least 1, not {settings.webhook_concurrency}"
        )
    from climate.notify.sinks import validate_webhook_urls  # climate.notify imports this module

    validate_webhook_urls(settings.webhooks)
    parse_flavors(settings.flavors)
    return settings
