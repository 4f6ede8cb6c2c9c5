"""Blazar's ExternalServiceFilter contract: an operator's HTTP service asked before a lease is
created or updated (and told when one ends): POST ``check-create``, ``check-update``,
``on-end`` with ``{"context": ..., "lease": ...}`` (``current_lease`` too for an update),
``X-Auth-Token`` when a token is set; 204 allows, 403 denies with ``{"message": ...}``."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import httpx

if TYPE_CHECKING:
    from climate.config import Settings

LOG = logging.getLogger(__name__)
GENERIC_DENY = "External service enforcement filter denied the request."
"""Blazar's words for an answer that is neither 204 nor a 403 with a message."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str
    failed: bool = False
    """The service did not answer 204 or 403 in time: ``allowed`` is the configured
    fail-open or fail-closed."""


def endpoint(settings: Settings, method: str) -> str:
    """The URL of ``check-create``, ``check-update`` or ``on-end``: its own setting, else
    under the base endpoint (as Blazar joins them), else "" (not called)."""
    own = {
        "check-create": settings.external_service_check_create_endpoint,
        "check-update": settings.external_service_check_update_endpoint,
        "on-end": settings.external_service_on_end_endpoint,
    }[method]
    if own:
        return own
    base = settings.external_service_base_endpoint
    return urljoin(base, method) if base else ""


def headers(settings: Settings) -> dict[str, str]:
    found = {"Content-Type": "application/json"}
    if settings.external_service_token:
        found["X-Auth-Token"] = settings.external_service_token
    return found


def context(settings: Settings, project_id: str, user_id: str) -> dict[str, Any]:
    """Blazar's ``context``: the lease's owner and where its cloud's Keystone is."""
    return {
        "user_id": user_id,
        "project_id": project_id,
        "auth_url": settings.os_auth_url or None,
        "region_name": settings.os_region_name or None,
    }


def ask(settings: Settings, url: str, body: Mapping[str, Any]) -> Verdict:
    """POST ``body`` to ``url`` and read the verdict; a timeout, a refused connection or any
    other answer is a failure, logged, decided by ``external_service_fail_open``."""
    try:
        response = httpx.post(
            url,
            content=json.dumps(body, sort_keys=True),
            headers=headers(settings),
            timeout=settings.external_service_timeout_seconds,
        )
    except httpx.HTTPError as exc:
        return _failed(settings, url, f"{type(exc).__name__}: {exc}")
    if response.status_code == 204:
        return Verdict(True, "")
    if response.status_code == 403:
        try:
            message = response.json()["message"]
        except (ValueError, KeyError, TypeError):
            message = None
        if isinstance(message, str) and message:
            LOG.info("external service %s denied: %s", url, message)
            return Verdict(False, message)
        LOG.info("external service %s denied without a message: %r", url, response.content)
        return Verdict(False, GENERIC_DENY)
    return _failed(settings, url, f"HTTP {response.status_code}")


def _failed(settings: Settings, url: str, problem: str) -> Verdict:
    open_ = settings.external_service_fail_open
    LOG.warning(
        "external service %s failed (%s): %s as configured (external_service_fail_open = %s)",
        url,
        problem,
        "admitting" if open_ else "refusing",
        str(open_).lower(),
    )
    message = f"the external admission service did not answer ({problem})"
    return Verdict(open_, message, failed=True)
