"""Heat stack templates: the reservations a HOT template needs, and one lease for all of them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from climate.config import load_settings
from climate.errors import InvalidInput
from climate.services.templates import Flavor, parse_flavors, reservations_from_template
from tests.conftest import LiveServer
from tests.test_cli import run, run_json

FLAVORS = parse_flavors(load_settings(env={}).flavors)
WINDOW = {"start_date": "2031-03-01 10:00", "end_date": "2031-03-01 12:00"}


def hot(resources: str, parameters: str = "") -> str:
    text = "heat_template_version: 2018-08-31\n"
    if parameters:
        text += "parameters:\n" + textwrap.indent(textwrap.dedent(parameters), "  ")
    return text + "resources:\n" + textwrap.indent(textwrap.dedent(resources), "  ")


def translate(text: str, **parameters: str) -> tuple[list[dict[str, object]], list[str]]:
    return reservations_from_template(text, parameters, FLAVORS)


def refusal(text: str, **parameters: str) -> str:
    with pytest.raises(InvalidInput) as refused:
        translate(text, **parameters)
    return refused.value.field


def test_servers_become_one_instance_reservation_per_flavor() -> None:
    reservations, warnings = translate(
        hot("""
            web1: {type: OS::Nova::Server, properties: {flavor: m1.small, image: cirros}}
            db: {type: OS::Nova::Server, properties: {flavor: m1.large}}
            web2: {type: OS::Nova::Server, properties: {flavor: m1.small}}
        """)
    )
    assert reservations == [
        {
            "resource_type": "virtual:instance",
            "amount": 2,
            "vcpus": 1,
            "memory_mb": 2048,
            "disk_gb": 20,
        },
        {
            "resource_type": "virtual:instance",
            "amount": 1,
            "vcpus": 4,
            "memory_mb": 8192,
            "disk_gb": 80,
        },
    ]
    assert warnings == []


def test_a_flavor_parameter_takes_the_given_value_else_its_default() -> None:
    template = hot(
        "app: {type: OS::Nova::Server, properties: {flavor: {get_param: size}}}\n",
        "size: {type: string, default: m1.tiny}\n",
    )
    [by_default], _ = translate(template)
    [given], _ = translate(template, size="m1.xlarge")
    assert (by_default["vcpus"], by_default["memory_mb"]) == (1, 512)
    assert (given["vcpus"], given["memory_mb"]) == (8, 16384)


def test_a_parameter_without_value_or_default_is_named() -> None:
    template = hot(
        "app: {type: OS::Nova::Server, properties: {flavor: {get_param: size}}}\n",
        "size: {type: string}\n",
    )
    assert refusal(template) == "parameters.size"


def test_volumes_are_grouped_by_size_and_floating_ips_by_network() -> None:
    reservations, _ = translate(
        hot("""
            data1: {type: OS::Cinder::Volume, properties: {size: 10}}
            data2: {type: OS::Cinder::Volume, properties: {size: 10}}
            logs: {type: OS::Cinder::Volume, properties: {size: 50}}
            ip1: {type: OS::Neutron::FloatingIP, properties: {floating_network: public}}
            ip2: {type: OS::Neutron::FloatingIP, properties: {floating_network_id: public}}
            ip3: {type: OS::Neutron::FloatingIP, properties: {floating_network: other}}
        """)
    )
    assert reservations == [
        {"resource_type": "virtual:volume", "size_gb": 10, "amount": 2},
        {"resource_type": "virtual:volume", "size_gb": 50, "amount": 1},
        {"resource_type": "virtual:floatingip", "network_id": "public", "amount": 2},
        {"resource_type": "virtual:floatingip", "network_id": "other", "amount": 1},
    ]


def test_a_resource_group_multiplies_its_definition_by_its_count() -> None:
    reservations, _ = translate(
        hot(
            """
            workers:
              type: OS::Heat::ResourceGroup
              properties:
                count: {get_param: workers}
                resource_def: {type: OS::Nova::Server, properties: {flavor: m1.medium}}
            head: {type: OS::Nova::Server, properties: {flavor: m1.medium}}
            disks:
              type: OS::Heat::ResourceGroup
              properties:
                count: 0
                resource_def: {type: OS::Cinder::Volume, properties: {size: 5}}
            """,
            "workers: {type: number, default: 2}\n",
        ),
        workers="3",
    )
    assert reservations == [
        {
            "resource_type": "virtual:instance",
            "amount": 4,
            "vcpus": 2,
            "memory_mb": 4096,
            "disk_gb": 40,
        }
    ]


def test_unknown_resource_types_are_warned_about_not_dropped_silently() -> None:
    reservations, warnings = translate(
        hot("""
            net: {type: OS::Neutron::Net}
            vm: {type: OS::Nova::Server, properties: {flavor: m1.tiny}}
            ports:
              type: OS::Heat::ResourceGroup
              properties: {count: 2, resource_def: {type: OS::Neutron::Port}}
        """)
    )
    assert [r["resource_type"] for r in reservations] == ["virtual:instance"]
    assert warnings == [
        "net: resource type OS::Neutron::Net is not reserved",
        "ports: resource type OS::Neutron::Port is not reserved",
    ]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("resources: [unclosed", "template"),
        ("just some text", "template"),
        ("resources: {vm: {type: OS::Nova::Server}}", "template.heat_template_version"),
        ("heat_template_version: 2018-08-31\n", "template.resources"),
        ("heat_template_version: 2018-08-31\nresources: [a, b]\n", "template.resources"),
        (hot("vm: {properties: {}}\n"), "template.resources.vm"),
        (hot("vm: {type: OS::Nova::Server}\n"), "template.resources.vm.properties.flavor"),
        (
            hot("vm: {type: OS::Nova::Server, properties: {flavor: m9.huge}}\n"),
            "template.resources.vm.properties.flavor",
        ),
        (
            hot("d: {type: OS::Cinder::Volume, properties: {size: big}}\n"),
            "template.resources.d.properties.size",
        ),
        (
            hot("g: {type: OS::Heat::ResourceGroup, properties: {count: -1}}\n"),
            "template.resources.g.properties.count",
        ),
    ],
)
def test_a_template_that_is_not_yaml_or_not_hot_names_the_field(text: str, field: str) -> None:
    assert refusal(text) == field


def test_flavors_setting_is_name_equals_vcpus_memory_disk() -> None:
    assert parse_flavors("gpu.big=16:65536:200, tiny=1:256:0") == {
        "gpu.big": Flavor(16, 65536, 200),
        "tiny": Flavor(1, 256, 0),
    }
    assert set(FLAVORS) == {"m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge"}
    with pytest.raises(InvalidInput, match="flavors"):
        load_settings(env={"CLIMATE_FLAVORS": "m1.small=1:2048"})


STACK = hot(
    """
    web:
      type: OS::Heat::ResourceGroup
      properties:
        count: {get_param: web_count}
        resource_def: {type: OS::Nova::Server, properties: {flavor: m1.small}}
    data: {type: OS::Cinder::Volume, properties: {size: 30}}
    ip: {type: OS::Neutron::FloatingIP, properties: {floating_network: ext-net}}
    net: {type: OS::Neutron::Net}
    """,
    "web_count: {type: number, default: 1}\n",
)


def test_a_stack_template_becomes_one_lease_or_nothing(live: LiveServer) -> None:
    with httpx.Client(base_url=f"{live.url}/v1", timeout=30) as http:
        http.post(
            "/os-hosts", json={"name": "h1", "vcpus": 4, "memory_mb": 8192, "local_gb": 100}
        ).raise_for_status()
        http.post("/volume-pools", json={"name": "ssd", "capacity_gb": 100}).raise_for_status()
        for address in ("172.24.4.10", "172.24.4.11"):
            ip = {"floating_network_id": "ext-net", "floating_ip_address": address}
            http.post("/floatingips", json=ip).raise_for_status()

        body = {"name": "stack", **WINDOW, "template": STACK, "parameters": {"web_count": 3}}
        created = http.post("/leases/from-template", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["warnings"] == ["net: resource type OS::Neutron::Net is not reserved"]
        reservations = created.json()["lease"]["reservations"]
        assert sorted((r["resource_type"], r["amount"]) for r in reservations) == [
            ("virtual:floatingip", 1),
            ("virtual:instance", 3),
            ("virtual:volume", 1),
        ]

        # Five servers do not fit the host's 4 vcpus: nothing of the stack is reserved.
        too_big = {**body, "name": "too-big", "parameters": {"web_count": 5}}
        refused = http.post("/leases/from-template", json=too_big)
        assert refused.status_code == 409, refused.text
        unknown = {**body, "name": "bad", "template": STACK.replace("m1.small", "m9.huge")}
        refused = http.post("/leases/from-template", json=unknown)
        assert refused.status_code == 400
        assert refused.json()["error_message"].startswith("template.resources.web.properties")
        names = [lease["name"] for lease in http.get("/leases").json()["leases"]]
        assert names == ["stack"]


def test_the_cli_creates_a_stack_lease_and_prints_the_warnings(
    live_sqlite: LiveServer, tmp_path: Path
) -> None:
    url = ("--url", live_sqlite.url)
    size = ("--extra", "vcpus=4", "--extra", "memory_mb=8192", "--extra", "local_gb=100")
    run("host", "create", "h1", *size, *url)
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        hot(
            "web: {type: OS::Nova::Server, properties: {flavor: {get_param: size}}}\n"
            "net: {type: OS::Neutron::Net}\n",
            "size: {type: string, default: m1.large}\n",
        )
    )
    window = ("--start", WINDOW["start_date"], "--end", WINDOW["end_date"])
    done = run(
        "lease",
        "create",
        "stack",
        "--from-template",
        str(stack),
        *window,
        *url,
        "--parameter",
        "size=m1.small",
    )
    assert "virtual:instance" in done.stdout
    assert "warning: net: resource type OS::Neutron::Net is not reserved" in done.stderr
    [lease] = run_json("lease", "list", *url)
    assert lease["name"] == "stack"

    bad = run(
        "lease",
        "create",
        "bad",
        "--from-template",
        str(stack),
        *window,
        *url,
        "--parameter",
        "size=m9.huge",
        ok=False,
    )
    assert "error (400)" in bad.stderr and "template.resources.web.properties.flavor" in bad.stderr
