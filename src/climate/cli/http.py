"""The API client of the friendly commands: where the server is and who the caller is (from the
options, Climate's variables, the ``OS_*`` variables the ``blazar`` and ``openstack`` commands
read, a Keystone sign-in, then Climate's config file; docs/cli.md), and objects found by id or
by name."""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import httpx

from climate.cli.lease_display import counter_offers
from climate.cli.output import add_format_options, pooled_name, printable, show_dates

if TYPE_CHECKING:
    from climate.keystone import ServiceCredentials

DEFAULT_URL = "http://127.0.0.1:1234"
NO_AUTH = frozenset({"none", "noauth"})
TOKEN_AUTH = frozenset({"admin_token", "token", "v3token"})


class ApiClient:
    def __init__(self, url: str, token: str | None, project: str | None, roles: str | None) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["X-Auth-Token"] = token
        if project:
            headers["X-Project-Id"] = project
            headers["X-Roles"] = roles or "member"
        self.http = httpx.Client(base_url=url + "/v1", headers=headers, timeout=30)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise SystemExit(f"error: cannot reach {self.http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                error = response.json()
                message = show_dates(printable(str(error.get("error_message", response.text))))
                message += counter_offers(error)
            except (ValueError, AttributeError):
                message = printable(_first_line(response.text))
            raise SystemExit(f"error ({response.status_code}): {message}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise SystemExit(
                f"error: {self.http.base_url} answered {response.status_code} with no JSON "
                f"(is it Climate?): {printable(_first_line(response.text))}"
            ) from None

    def lookup(self, path: str) -> tuple[int, Any]:
        """``GET path``'s status and body, never failing (for optional details such as names;
        status 0: no answer)."""
        try:
            response = self.http.get(path)
        except httpx.HTTPError:
            return 0, None
        return response.status_code, response.json() if response.status_code == 200 else None

    def every(self, path: str, key: str, **query: str) -> list[dict[str, Any]]:
        """Every object of a list, page after page (``marker``: the last id of a page), until
        a page brings nothing new: an empty one, or the same again from a list that is never
        paged (``/lease-series`` answers all of it whatever the marker)."""
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        marker = None
        while True:
            page_query = {**query, **({"marker": marker} if marker else {})}
            page = self.call("GET", f"{path}?{urlencode(page_query)}" if page_query else path)
            rows: list[dict[str, Any]] = page[key]
            fresh = [row for row in rows if str(row["id"]) not in seen]
            if not fresh:
                return found
            found += fresh
            seen.update(str(row["id"]) for row in fresh)
            marker = str(rows[-1]["id"])


# -- where and who ------------------------------------------------------------------------------


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """The connection options (each also from a variable; docs/cli.md) and ``-f``."""
    parser.add_argument(
        "--url",
        help="Climate's address, e.g. http://127.0.0.1:1234 (default: $CLIMATE_URL, "
        "$OS_ENDPOINT, the Keystone catalog, then bind_host and port of the config file)",
    )
    parser.add_argument(
        "--token", help="an API or Keystone token (default: $CLIMATE_TOKEN, $OS_TOKEN, Keystone)"
    )
    parser.add_argument(
        "--project",
        default=os.environ.get("CLIMATE_PROJECT"),
        help="act as this project (noauth mode; default $CLIMATE_PROJECT)",
    )
    parser.add_argument(
        "--roles", default=os.environ.get("CLIMATE_ROLES"), help="with --project (noauth mode)"
    )
    add_format_options(parser)


@dataclass(frozen=True)
class Connection:
    url: str
    """Without ``/v1``."""
    token: str | None


def connect(args: argparse.Namespace) -> ApiClient:
    found = connection(args)
    return ApiClient(found.url, found.token, args.project, args.roles)


def connection(args: argparse.Namespace) -> Connection:
    """The server and the token, each from the first that gives it (docs/cli.md):
    the URL from ``--url``, ``CLIMATE_URL``, ``OS_ENDPOINT``, the Keystone catalog (when a
    Keystone sign-in is configured), ``bind_host``/``port`` of Climate's settings (its config
    file and ``CLIMATE_*``); the token from ``--token``, ``CLIMATE_TOKEN``, ``OS_TOKEN`` (not
    with ``OS_AUTH_TYPE=none``), a Keystone sign-in."""
    env = os.environ
    url = args.url or env.get("CLIMATE_URL") or env.get("OS_ENDPOINT")
    auth_type = env.get("OS_AUTH_TYPE", "").lower()
    token = args.token or env.get("CLIMATE_TOKEN")
    if token is None and auth_type not in NO_AUTH:
        token = env.get("OS_TOKEN")
    if url and (token or auth_type in NO_AUTH | TOKEN_AUTH):
        return Connection(_base(url), token)
    credentials = None
    if auth_type not in NO_AUTH | TOKEN_AUTH and _may_sign_in(args.config):
        credentials = _keystone(args.config)
    if credentials is not None and (token is None or url is None):
        signed_in, endpoint = _sign_in(credentials)
        return Connection(_base(url or endpoint), token or signed_in)
    return Connection(_base(url or _configured_url(args.config)), token)


def _may_sign_in(config: str | None) -> bool:
    """Whether Keystone credentials may be configured (reading the settings takes time)."""
    given = ("OS_AUTH_URL", "OS_CLOUD", "CLIMATE_OS_AUTH_URL", "CLIMATE_OS_CLOUD", "CLIMATE_CONFIG")
    return bool(config) or any(os.environ.get(name) for name in given)


def _base(url: str) -> str:
    """``http://host:1234`` from that, or with ``/v1`` (as ``OS_ENDPOINT`` and the catalog
    give it)."""
    return re.sub(r"/v1/?$", "", url.rstrip("/"))


def _configured_url(config: str | None) -> str:
    """Where Climate's own settings say it listens (a wildcard address: this machine)."""
    from climate.config import load_settings

    settings = load_settings(config)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.bind_host, settings.bind_host
    )
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def _keystone(config: str | None) -> ServiceCredentials | None:
    """The Keystone credentials of the ``OS_*`` variables (over the ``os_*`` settings of the
    config file and a clouds.yaml cloud), as ``openstack`` reads them; None when there are none."""
    from climate.config import load_settings
    from climate.errors import InvalidInput
    from climate.keystone import service_credentials

    settings = load_settings(config)
    if not (settings.os_auth_url or settings.os_cloud):
        return None
    try:
        return service_credentials(settings)
    except InvalidInput as exc:
        raise SystemExit(f"error: cannot sign in to Keystone: {exc.message}") from None


def _sign_in(credentials: ServiceCredentials) -> tuple[str, str]:
    """A Keystone token and the reservation service's endpoint in the catalog ("" if none)."""
    try:
        from keystoneauth1 import exceptions, loading, session
        from keystoneauth1.plugin import BaseAuthPlugin
    except ImportError:
        raise SystemExit(
            "error: OS_AUTH_URL: signing in to Keystone needs keystoneauth1 "
            "(pip install 'climate[openstack]')"
        ) from None
    url = credentials.auth["auth_url"]
    plugin: loading.BaseLoader[BaseAuthPlugin] = loading.get_plugin_loader(credentials.auth_type)
    keystone = session.Session(auth=plugin.load_from_options(**credentials.auth), timeout=30)
    try:
        token = keystone.get_token()
        endpoint = keystone.get_endpoint(
            service_type="reservation",
            interface=credentials.interface or "public",
            region_name=credentials.region_name or None,
        )
    except (exceptions.ConnectFailure, exceptions.DiscoveryFailure) as exc:
        raise SystemExit(f"error: OS_AUTH_URL: cannot reach Keystone at {url}: {exc}") from None
    except exceptions.Unauthorized:
        raise SystemExit(
            f"error: Keystone at {url} refused the credentials of the OS_* variables"
        ) from None
    except exceptions.EndpointNotFound:
        endpoint = None
    except exceptions.ClientException as exc:
        raise SystemExit(f"error: OS_AUTH_URL: Keystone at {url} answered: {exc}") from None
    return str(token), str(endpoint or DEFAULT_URL)


# -- by id or by name ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of object the commands name: where it lives and which field names it."""

    noun: str
    path: str
    list_key: str
    name_field: str
    numbered: bool = False
    """Its ids are numbers, which a name may be too (a host named ``12345``); else UUIDs."""
    pool_field: str | None = None
    """The field a name is unique within (a segment's physical network): ``POOL/NAME`` names
    one where the name alone names several."""
    filter_by_name: bool = False
    """The list takes ``?name=`` (leases)."""


_UUID = re.compile(r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")
_NUMBER = re.compile(r"[0-9]+")
LEASE = Kind("lease", "/leases", "leases", "name", filter_by_name=True)
HOST = Kind("host", "/os-hosts", "hosts", "hypervisor_hostname", numbered=True)
SERIES = Kind("series", "/lease-series", "series", "name")


def find_id(api: ApiClient, kind: Kind, ref: str) -> str:
    """The id of the ``kind`` named or identified by ``ref``: a UUID as is (as ``blazar`` takes
    one), a number that is an object's id, else the one object with that name; none or several
    is an error naming them. A number that is one object's id and another's name is the id, and
    a note on stderr says so."""
    if not kind.numbered and _UUID.fullmatch(ref):
        return ref
    query = {"name": ref} if kind.filter_by_name else {}
    found = api.every(kind.path, kind.list_key, **query)
    matches = [item for item in found if ref in _names(kind, item)]
    shown = printable(ref)
    if kind.numbered and _NUMBER.fullmatch(ref) and any(str(i["id"]) == ref for i in found):
        others = ", ".join(str(m["id"]) for m in matches if str(m["id"]) != ref)
        if others:
            print(
                f"note: '{shown}' is the id of {kind.noun} {shown} and the name of "
                f"{kind.noun} {others}: using {kind.noun} {shown} (give {others} for the other)",
                file=sys.stderr,
            )
        return ref
    if len(matches) == 1:
        return str(matches[0]["id"])
    if not matches:
        raise SystemExit(f"error: no {kind.noun} with the id or name '{shown}'")
    listed = ", ".join(printable(_summary(kind, m)) for m in matches)
    either = "an id"
    if kind.pool_field is not None:
        example = _names(kind, matches[0])[-1]
        either += f" or {kind.pool_field}/{kind.name_field} such as {printable(example)}"
    raise SystemExit(
        f"error: {len(matches)} {kind.noun}s are named '{shown}': {listed}; give {either}"
    )


def _names(kind: Kind, item: dict[str, Any]) -> tuple[str, ...]:
    """What names ``item``: its name, and ``POOL/NAME`` for a kind with pools."""
    name = str(item.get(kind.name_field))
    pooled = pooled_name(item, kind.name_field, kind.pool_field)
    return (name,) if pooled in (None, name) else (name, str(pooled))


def _summary(kind: Kind, found: dict[str, Any]) -> str:
    if kind.pool_field is not None:
        return f"{found['id']} ({_names(kind, found)[-1]})"
    extra = [str(found[k]) for k in ("status", "project_id", "start_date") if found.get(k)]
    return f"{found['id']} ({', '.join(extra)})" if extra else str(found["id"])


def path_of(kind: Kind, ident: str) -> str:
    return f"{kind.path}/{quote(ident, safe='')}"


def _first_line(text: str, most: int = 200) -> str:
    """What a page that is not Climate's answered, cut to a line."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= most else line[:most] + "..."
