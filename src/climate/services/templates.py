"""Heat (HOT) stack templates turned into the reservations one lease needs for the whole stack.

Pure translation: servers become ``virtual:instance`` reservations grouped by flavor, volumes
``virtual:volume`` grouped by size, floating IPs ``virtual:floatingip`` grouped by network;
``OS::Heat::ResourceGroup`` multiplies its ``resource_def`` by ``count``. A server's block device
mappings that create volumes count as volumes of their ``volume_size``. Nested stacks (a resource
whose type is a file name, or ``OS::Heat::Stack``) are read from the request's ``files``, as Heat
reads them. Any other resource type is not reserved and comes back as a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from climate import inputs
from climate.domain.flavors import Flavor
from climate.errors import InvalidInput

SERVER = "OS::Nova::Server"
VOLUME = "OS::Cinder::Volume"
FLOATING_IP = "OS::Neutron::FloatingIP"
GROUP = "OS::Heat::ResourceGroup"
STACK = "OS::Heat::Stack"
BLOCK_DEVICE_MAPPINGS = ("block_device_mapping", "block_device_mapping_v2")


MAX_DEPTH = 5
"""How deep nested stacks may go (a template inside a template is depth 1), and resource groups
inside one another."""
MAX_RESOURCES = 10_000
"""Resources read in all, nested stacks expanded: a bound on the work one request asks for."""
NESTED_SUFFIXES = (".yaml", ".yml", ".template")


@dataclass(frozen=True)
class _Scope:
    """One template being read: where its fields are named from, its parameters' values and
    declarations, and the chain of templates that led to it (for the depth cap and cycles)."""

    where: str
    """``template`` or ``files.<name>``: the prefix of its fields in errors."""
    parameters: Mapping[str, object]
    declared: Mapping[str, Any]
    parameters_field: str
    """Where a missing parameter's value would have been given."""
    chain: tuple[str, ...] = ()
    prefix: str = ""
    """Prepended to resource names in warnings (``web/`` inside the nested stack ``web``)."""


@dataclass(frozen=True)
class _Times:
    """How many times a resource counts: the product of the ``count`` of each resource group
    around it (nested stacks included), and the fields of those counts, outermost first."""

    n: int = 1
    counts: tuple[str, ...] = ()

    def by(self, count: int, field: str) -> _Times:
        return _Times(self.n * count, (*self.counts, field))


@dataclass(frozen=True)
class _Nested:
    """A nested stack as its parent names it."""

    name: str
    """The parent's resource."""
    where: str
    """``files.<name>``, or the inline template's field."""
    link: str
    """Its entry in the chain of templates."""
    given: object
    """The parameter values the parent passes."""
    given_field: str


class _Translation:
    """Counts per flavor, volume size and network, in the order the template names them."""

    def __init__(self, flavors: Mapping[str, Flavor], files: Mapping[str, str]) -> None:
        self.flavors = flavors
        self.files = files
        self.servers: dict[str, int] = {}
        self.volumes: dict[int, int] = {}
        self.floating_ips: dict[str, int] = {}
        self.warnings: list[str] = []
        self.read = 0

    def template(self, scope: _Scope, raw: object, times: _Times) -> None:
        """Every resource of a parsed template, each ``times`` over."""
        if not isinstance(raw, dict):
            raise InvalidInput(scope.where, "must be a YAML mapping (a HOT template)")
        if "heat_template_version" not in raw:
            raise InvalidInput(
                f"{scope.where}.heat_template_version", "missing: not a HOT template"
            )
        resources = raw.get("resources")
        if not isinstance(resources, dict) or not resources:
            raise InvalidInput(
                f"{scope.where}.resources", "must be a non-empty mapping of resources"
            )
        for name, resource in resources.items():
            self.read += 1
            if self.read > MAX_RESOURCES:
                raise InvalidInput(
                    scope.where, f"more than {MAX_RESOURCES} resources with nested stacks expanded"
                )
            self.add(scope, str(name), resource, f"{scope.where}.resources.{name}", times)

    def value(self, scope: _Scope, raw: object, field: str) -> object:
        """``raw`` with ``{get_param: name}`` resolved: a given parameter, else its default."""
        if not (isinstance(raw, dict) and set(raw) == {"get_param"}):
            return raw
        name = raw["get_param"]
        if not isinstance(name, str):
            raise InvalidInput(field, f"get_param must name one parameter, not {name!r}")
        if name in scope.parameters:
            return scope.parameters[name]
        declared = scope.declared.get(name)
        if isinstance(declared, dict) and declared.get("default") is not None:
            return declared["default"]
        raise InvalidInput(
            f"{scope.parameters_field}.{name}", f"needed by {field} and has no value"
        )

    def text(self, scope: _Scope, properties: Mapping[str, Any], key: str, field: str) -> str:
        found = self.value(scope, properties.get(key), f"{field}.{key}")
        if not isinstance(found, str | int) or isinstance(found, bool) or not str(found):
            raise InvalidInput(f"{field}.{key}", f"must be a non-empty string, not {found!r}")
        return str(found)

    def count(
        self, scope: _Scope, properties: Mapping[str, Any], key: str, field: str, minimum: int
    ) -> int:
        found = self.value(scope, properties.get(key), f"{field}.{key}")
        return inputs.integer(f"{field}.{key}", found, minimum=minimum)

    def add(
        self, scope: _Scope, name: str, resource: object, field: str, times: _Times, groups: int = 0
    ) -> None:
        """One resource, ``times`` over, inside ``groups`` resource groups."""
        if not isinstance(resource, dict) or not isinstance(resource.get("type"), str):
            raise InvalidInput(field, "must be a mapping with a string 'type'")
        kind = resource["type"]
        properties = resource.get("properties") or {}
        if not isinstance(properties, dict):
            raise InvalidInput(f"{field}.properties", "must be a mapping")
        where = f"{field}.properties"
        if kind == SERVER:
            flavor = self.text(scope, properties, "flavor", where)
            if flavor not in self.flavors:
                known = ", ".join(sorted(self.flavors))
                raise InvalidInput(f"{where}.flavor", f"unknown flavor {flavor!r} (known: {known})")
            self.tally(self.servers, flavor, times, field, f"servers of flavor {flavor}")
            self.boot_volumes(scope, properties, where, times)
        elif kind == VOLUME:
            size = self.count(scope, properties, "size", where, minimum=1)
            self.add_volume(size, times, field)
        elif kind == FLOATING_IP:
            key = "floating_network" if "floating_network" in properties else "floating_network_id"
            network = self.text(scope, properties, key, where)
            what = f"floating IPs on network {network}"
            self.tally(self.floating_ips, network, times, field, what)
        elif kind == GROUP:
            count = self.count(scope, properties, "count", where, minimum=0)
            definition = properties.get("resource_def")
            if groups == MAX_DEPTH:  # a YAML alias can make a group its own resource_def
                raise InvalidInput(
                    f"{where}.resource_def", f"resource groups nested deeper than {MAX_DEPTH}"
                )
            inside = times.by(count, f"{where}.count")
            self.add(scope, name, definition, f"{where}.resource_def", inside, groups + 1)
        elif kind == STACK:
            self.stack(scope, name, properties, where, times)
        elif kind.endswith(NESTED_SUFFIXES) or "/" in kind or kind in self.files:
            self.nested_file(scope, name, kind, properties, where, times)
        else:
            self.warnings.append(f"{scope.prefix}{name}: resource type {kind} is not reserved")

    def add_volume(self, size: int, times: _Times, field: str) -> None:
        self.tally(self.volumes, size, times, field, f"volumes of {size} GB")

    def tally(
        self, totals: dict[Any, int], key: object, times: _Times, field: str, what: str
    ) -> None:
        """Add ``times`` to ``totals[key]``; a total past the largest amount a reservation
        takes is refused, naming the count the user wrote that took it there (the innermost
        resource group's, else the resource)."""
        total = totals.get(key, 0) + times.n
        if total > inputs.MAX_INT:
            where = times.counts[-1] if times.counts else field
            made = f"makes {times.n} {what}"
            if len(times.counts) > 1:
                made = f"{' x '.join(times.counts)} make {times.n} {what}"
            if totals.get(key):
                made += f", {total} with those before it"
            raise InvalidInput(where, f"{made}; one reservation takes at most {inputs.MAX_INT}")
        totals[key] = total

    def boot_volumes(
        self, scope: _Scope, properties: Mapping[str, Any], where: str, times: _Times
    ) -> None:
        """The volumes a server's block device mappings create: an entry with a
        ``volume_size`` and no ``volume_id`` (which would name an existing volume)."""
        for key in BLOCK_DEVICE_MAPPINGS:
            entries = self.value(scope, properties.get(key), f"{where}.{key}") or []
            if not isinstance(entries, list):
                raise InvalidInput(f"{where}.{key}", "must be a list of block device mappings")
            for i, entry in enumerate(entries):
                field = f"{where}.{key}[{i}]"
                if not isinstance(entry, dict):
                    raise InvalidInput(field, "must be a mapping")
                if entry.get("volume_size") is None or entry.get("volume_id") is not None:
                    continue
                size = self.count(scope, entry, "volume_size", field, minimum=1)
                self.add_volume(size, times, field)

    def stack(
        self,
        scope: _Scope,
        name: str,
        properties: Mapping[str, Any],
        where: str,
        times: _Times,
    ) -> None:
        """``OS::Heat::Stack``: its ``template`` inline or ``{get_file: name}``, its
        ``parameters`` the nested template's."""
        template = properties.get("template")
        given = properties.get("parameters") or {}
        if isinstance(template, dict) and set(template) == {"get_file"}:
            file = str(template["get_file"])
            self.nested_file(scope, name, file, given, f"{where}.parameters", times)
        elif isinstance(template, str):
            inline = f"{where}.template"
            nested = _Nested(name, inline, inline, given, f"{where}.parameters")
            self.enter(scope, nested, template, times)
        else:
            raise InvalidInput(f"{where}.template", "required: the nested template's YAML text")

    def nested_file(
        self,
        scope: _Scope,
        name: str,
        file: str,
        given: object,
        given_field: str,
        times: _Times,
    ) -> None:
        """A nested template from the request's ``files``; one not given is warned about."""
        if file not in self.files:
            self.warnings.append(
                f"{scope.prefix}{name}: nested template {file} is not in files; not reserved"
            )
            return
        if file in scope.chain:
            cycle = " -> ".join((*scope.chain, file))
            raise InvalidInput(f"files.{file}", f"nested stacks form a cycle: {cycle}")
        nested = _Nested(name, f"files.{file}", file, given, given_field)
        self.enter(scope, nested, self.files[file], times)

    def enter(self, scope: _Scope, nested: _Nested, text: str, times: _Times) -> None:
        """Read a nested template with the values its parent passes as its parameters."""
        chain = (*scope.chain, nested.link)
        if len(chain) > MAX_DEPTH:
            raise InvalidInput(
                nested.where, f"nested stacks deeper than {MAX_DEPTH}: {' -> '.join(chain)}"
            )
        template = _parse(nested.where, text)
        if not isinstance(nested.given, dict):
            raise InvalidInput(nested.given_field, "must be a mapping of parameter values")
        values = {
            str(k): self.value(scope, v, f"{nested.given_field}.{k}")
            for k, v in nested.given.items()
        }
        inner = _Scope(
            where=nested.where,
            parameters=values,
            declared=_declared(nested.where, template),
            parameters_field=nested.given_field,
            chain=chain,
            prefix=f"{scope.prefix}{nested.name}/",
        )
        self.template(inner, template, times)

    def reservations(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for flavor, amount in self.servers.items():
            size = self.flavors[flavor]
            found.append(
                {
                    "resource_type": "virtual:instance",
                    "amount": amount,
                    "vcpus": size.vcpus,
                    "memory_mb": size.memory_mb,
                    "disk_gb": size.disk_gb,
                }
            )
        found.extend(
            {"resource_type": "virtual:volume", "size_gb": size, "amount": amount}
            for size, amount in self.volumes.items()
        )
        found.extend(
            {"resource_type": "virtual:floatingip", "network_id": network, "amount": amount}
            for network, amount in self.floating_ips.items()
        )
        return [r for r in found if r["amount"] > 0]


def _declared(where: str, template: object) -> Mapping[str, Any]:
    """A template's parameter declarations (checked as a template later if not a mapping)."""
    declared = template.get("parameters") if isinstance(template, dict) else None
    if declared is not None and not isinstance(declared, dict):
        raise InvalidInput(f"{where}.parameters", "must be a mapping")
    return declared or {}


def _parse(field: str, text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(field, f"not YAML: {exc}") from exc


def reservations_from_template(
    text: str,
    parameters: Mapping[str, str],
    flavors: Mapping[str, Flavor],
    files: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The Blazar-shaped reservations a HOT template needs, and a warning per resource that is
    not reserved. Nested stacks (a resource whose type is a file name, or ``OS::Heat::Stack``)
    are read from ``files`` (file name -> template text), at most ``MAX_DEPTH`` deep.

    :raises InvalidInput: the template or a nested one is not YAML, not HOT, or a resource is
        wrong (named, nested ones under ``files.<name>``); nested stacks form a cycle or go too
        deep.
    """
    template = _parse("template", text)
    scope = _Scope("template", parameters, _declared("template", template), "parameters")
    translation = _Translation(flavors, files or {})
    translation.template(scope, template, _Times())
    return translation.reservations(), translation.warnings
