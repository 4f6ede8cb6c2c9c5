"""Who is calling: noauth (identity headers, or the configured default admin), Climate's API
tokens, or Keystone tokens (validated by keystonemiddleware)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Request

from climate.config import Settings
from climate.domain.actor import Actor
from climate.errors import Forbidden, NotAuthorized
from climate.services.tokens import TokenService

NOAUTH_ROLE = "member"
"""The role of a noauth caller who names a project but no roles."""


class Authenticator:
    def __init__(self, settings: Settings, tokens: TokenService) -> None:
        self.settings = settings
        self.tokens = tokens
        self.keystone = KeystoneTokens(settings) if settings.auth == "keystone" else None

    @property
    def blocks(self) -> bool:
        """Token lookups query the database or Keystone (the thread pool's job); noauth only
        reads headers."""
        return self.settings.auth != "noauth"

    @property
    def challenge(self) -> dict[str, str]:
        """Headers of a 401: where to get a token."""
        return self.keystone.challenge if self.keystone is not None else {}

    def __call__(self, request: Request) -> Actor:
        headers = request.headers
        if self.keystone is not None:
            return self.keystone.identify(headers.get("x-auth-token"))
        if self.settings.auth == "token":
            presented = headers.get("x-auth-token")
            if not presented:
                raise NotAuthorized("an X-Auth-Token header is required")
            actor = self.tokens.authenticate(presented)
            if actor is None:
                raise NotAuthorized("the token is unknown, expired or revoked")
            return actor
        project, user, roles = (
            headers.get("x-project-id"),
            headers.get("x-user-id"),
            headers.get("x-roles"),
        )
        if project is None and user is None and roles is None:
            return Actor(
                self.settings.default_user_id,
                self.settings.default_project_id,
                frozenset({self.settings.admin_role}),
            )
        if not project:
            # Half an identity must not borrow the default project (and see its leases).
            raise NotAuthorized("X-Project-Id is required when identity headers are sent")
        named = frozenset(r.strip() for r in (roles or "").split(",") if r.strip())
        return Actor(
            user or self.settings.default_user_id, project, named or frozenset({NOAUTH_ROLE})
        )


class _UnknownOptionFilter(logging.Filter):
    """keystonemiddleware warns about every auth plugin option given in its configuration
    (``auth_url``, ``username``...), although its docs say to give them there."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not known to keystonemiddleware" not in record.getMessage()


class KeystoneTokens:
    """keystonemiddleware's ``AuthProtocol`` with its token cache, called as the WSGI app it is
    with the request's token only. It decides nothing (``delay_auth_decision``): it writes the
    token's identity, or ``X-Identity-Status: Invalid``, into the environ, and Climate answers
    with Blazar's error body."""

    def __init__(self, settings: Settings) -> None:
        from keystonemiddleware import auth_token

        from climate.keystone import log_in, service_credentials

        credentials = service_credentials(settings)
        log_in(credentials, settings.backend_timeout_seconds)
        uri = settings.keystone_www_authenticate_uri or credentials.auth["auth_url"]
        conf: dict[str, Any] = {
            "auth_type": credentials.auth_type,
            **credentials.auth,
            "www_authenticate_uri": uri,
            "delay_auth_decision": True,
            "include_service_catalog": False,
            "token_cache_time": settings.keystone_token_cache_seconds,
            "http_connect_timeout": max(1, round(settings.backend_timeout_seconds)),
            "service_type": "reservation",
        }
        if credentials.region_name:
            conf["region_name"] = credentials.region_name
        if credentials.interface:
            conf["interface"] = credentials.interface
        logging.getLogger("keystonemiddleware._common.config").addFilter(_UnknownOptionFilter())
        self.protocol = auth_token.AuthProtocol(_accept, conf)
        self.challenge = {"WWW-Authenticate": f'Keystone uri="{uri}"'}

    def identify(self, token: str | None) -> Actor:
        """:raises NotAuthorized: no token, or one Keystone does not vouch for.
        :raises Forbidden: a token without a project (domain or system scope)."""
        if not token:
            raise NotAuthorized("an X-Auth-Token header is required")
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/",
            "SERVER_NAME": "climate",
            "SERVER_PORT": "80",
            "wsgi.url_scheme": "http",
            "HTTP_X_AUTH_TOKEN": token,
        }
        for _ in self.protocol(environ, _ignore_start):
            pass
        if environ.get("HTTP_X_IDENTITY_STATUS") != "Confirmed":
            raise NotAuthorized("the token is invalid, expired or revoked (Keystone)")
        project = environ.get("HTTP_X_PROJECT_ID")
        if not project:
            raise Forbidden(
                "a project-scoped token is required (Blazar's rules have project scope)"
            )
        roles = frozenset(r for r in str(environ.get("HTTP_X_ROLES") or "").split(",") if r)
        return Actor(str(environ["HTTP_X_USER_ID"]), str(project), roles, token=token)


def _accept(_environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("204 No Content", [])
    return []


def _ignore_start(_status: str, _headers: list[tuple[str, str]], _exc: object = None) -> None:
    return None
