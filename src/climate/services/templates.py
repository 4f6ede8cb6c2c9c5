"""Heat (HOT) stack templates turned into the reservations one lease needs for the whole stack.

Pure translation: servers become ``virtual:instance`` reservations grouped by flavor, volumes
``virtual:volume`` grouped by size, floating IPs ``virtual:floatingip`` grouped by network;
``OS::Heat::ResourceGroup`` multiplies its ``resource_def`` by ``count``. Any other resource type
is not reserved and comes back as a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from climate.errors import InvalidInput

SERVER = "OS::Nova::Server"
VOLUME = "OS::Cinder::Volume"
FLOATING_IP = "OS::Neutron::FloatingIP"
GROUP = "OS::Heat::ResourceGroup"


@dataclass(frozen=True)
class Flavor:
    vcpus: int
    memory_mb: int
    disk_gb: int


def parse_flavors(text: str) -> dict[str, Flavor]:
    """The ``flavors`` setting, ``name=vcpus:memory_mb:disk_gb`` separated by commas."""
    flavors = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, size = entry.partition("=")
        numbers = size.split(":")
        if not name.strip() or len(numbers) != 3 or not all(n.strip().isdigit() for n in numbers):
            raise InvalidInput("flavors", f"{entry!r} is not name=vcpus:memory_mb:disk_gb")
        vcpus, memory_mb, disk_gb = (int(n) for n in numbers)
        if vcpus < 1 or memory_mb < 1:
            raise InvalidInput("flavors", f"{entry!r}: vcpus and memory_mb must be at least 1")
        flavors[name.strip()] = Flavor(vcpus, memory_mb, disk_gb)
    return flavors


class _Translation:
    """Counts per flavor, volume size and network, in the order the template names them."""

    def __init__(
        self,
        defaults: Mapping[str, Any],
        parameters: Mapping[str, str],
        flavors: Mapping[str, Flavor],
    ) -> None:
        self.defaults = defaults
        self.parameters = parameters
        self.flavors = flavors
        self.servers: dict[str, int] = {}
        self.volumes: dict[int, int] = {}
        self.floating_ips: dict[str, int] = {}
        self.warnings: list[str] = []

    def value(self, raw: object, field: str) -> object:
        """``raw`` with ``{get_param: name}`` resolved: a given parameter, else its default."""
        if not (isinstance(raw, dict) and set(raw) == {"get_param"}):
            return raw
        name = raw["get_param"]
        if not isinstance(name, str):
            raise InvalidInput(field, f"get_param must name one parameter, not {name!r}")
        if name in self.parameters:
            return self.parameters[name]
        declared = self.defaults.get(name)
        if isinstance(declared, dict) and declared.get("default") is not None:
            return declared["default"]
        raise InvalidInput(f"parameters.{name}", f"needed by {field} and has no value")

    def text(self, properties: Mapping[str, Any], key: str, field: str) -> str:
        found = self.value(properties.get(key), f"{field}.{key}")
        if not isinstance(found, str | int) or isinstance(found, bool) or not str(found):
            raise InvalidInput(f"{field}.{key}", f"must be a non-empty string, not {found!r}")
        return str(found)

    def count(self, properties: Mapping[str, Any], key: str, field: str, minimum: int) -> int:
        found = self.value(properties.get(key), f"{field}.{key}")
        number = str(found).strip()
        if isinstance(found, bool) or not number.isdigit() or int(number) < minimum:
            raise InvalidInput(f"{field}.{key}", f"must be an integer >= {minimum}, not {found!r}")
        return int(number)

    def add(self, name: str, resource: object, field: str, times: int) -> None:
        if not isinstance(resource, dict) or not isinstance(resource.get("type"), str):
            raise InvalidInput(field, "must be a mapping with a string 'type'")
        kind = resource["type"]
        properties = resource.get("properties") or {}
        if not isinstance(properties, dict):
            raise InvalidInput(f"{field}.properties", "must be a mapping")
        where = f"{field}.properties"
        if kind == SERVER:
            flavor = self.text(properties, "flavor", where)
            if flavor not in self.flavors:
                known = ", ".join(sorted(self.flavors))
                raise InvalidInput(f"{where}.flavor", f"unknown flavor {flavor!r} (known: {known})")
            self.servers[flavor] = self.servers.get(flavor, 0) + times
        elif kind == VOLUME:
            size = self.count(properties, "size", where, minimum=1)
            self.volumes[size] = self.volumes.get(size, 0) + times
        elif kind == FLOATING_IP:
            key = "floating_network" if "floating_network" in properties else "floating_network_id"
            network = self.text(properties, key, where)
            self.floating_ips[network] = self.floating_ips.get(network, 0) + times
        elif kind == GROUP:
            count = self.count(properties, "count", where, minimum=0)
            self.add(name, properties.get("resource_def"), f"{where}.resource_def", times * count)
        else:
            self.warnings.append(f"{name}: resource type {kind} is not reserved")

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


def reservations_from_template(
    text: str, parameters: Mapping[str, str], flavors: Mapping[str, Flavor]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The Blazar-shaped reservations a HOT template needs, and a warning per resource that is
    not reserved.

    :raises InvalidInput: the template is not YAML, not HOT, or a resource is wrong (named).
    """
    try:
        template = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput("template", f"not YAML: {exc}") from exc
    if not isinstance(template, dict):
        raise InvalidInput("template", "must be a YAML mapping (a HOT template)")
    if "heat_template_version" not in template:
        raise InvalidInput("template.heat_template_version", "missing: not a HOT template")
    resources = template.get("resources")
    if not isinstance(resources, dict) or not resources:
        raise InvalidInput("template.resources", "must be a non-empty mapping of resources")
    defaults = template.get("parameters") or {}
    if not isinstance(defaults, dict):
        raise InvalidInput("template.parameters", "must be a mapping")
    translation = _Translation(defaults, parameters, flavors)
    for name, resource in resources.items():
        translation.add(str(name), resource, f"template.resources.{name}", 1)
    return translation.reservations(), translation.warnings
