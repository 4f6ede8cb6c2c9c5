"""Heat stack templates: the reservations a HOT template needs, and one lease for all of them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from climate.config import load_settings
from climate.domain.flavors import Flavor, parse_flavors
from climate.errors import InvalidInput
from climate.services.templates import reservations_from_template
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
    with pytest.raises(InvalidInput, match="^CLIMATE_FLAVORS: 'm1.small=1:2048' is not name="):
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


# -- block device mappings and nested stacks ---------------------------------------------------

SERVER = """
heat_template_version: 2018-08-31
parameters:
  flavor: {type: string, default: m1.tiny}
  disk: {type: number}
resources:
  vm:
    type: OS::Nova::Server
    properties:
      flavor: {get_param: flavor}
      block_device_mapping_v2: [{image: cirros, volume_size: {get_param: disk}, boot_index: 0}]
  ip: {type: OS::Neutron::FloatingIP, properties: {floating_network: ext-net}}
  port: {type: OS::Neutron::Port}
"""


def test_block_device_mappings_that_create_volumes_count_as_volumes() -> None:
    reservations, _ = translate(
        hot(
            """
            boot:
              type: OS::Nova::Server
              properties:
                flavor: m1.small
                block_device_mapping_v2:
                  - {image: cirros, volume_size: 20, boot_index: 0}
                  - {volume_id: existing-volume, volume_size: 99}
                  - {swap_size: 1}
                block_device_mapping:
                  - {device_name: vdb, snapshot_id: snap, volume_size: {get_param: data}}
            data: {type: OS::Cinder::Volume, properties: {size: 20}}
            farm:
              type: OS::Heat::ResourceGroup
              properties:
                count: 3
                resource_def:
                  type: OS::Nova::Server
                  properties:
                    flavor: m1.tiny
                    block_device_mapping_v2: [{image: cirros, volume_size: 20}]
        """,
            "data: {type: number, default: 5}\n",
        )
    )
    volumes = [r for r in reservations if r["resource_type"] == "virtual:volume"]
    # 20 GB: the boot volume, the Cinder volume and three in the group; an existing volume
    # (volume_id) and a swap disk are not reserved.
    assert volumes == [
        {"resource_type": "virtual:volume", "size_gb": 5, "amount": 1},
        {"resource_type": "virtual:volume", "size_gb": 20, "amount": 5},
    ]


@pytest.mark.parametrize(
    ("mapping", "field"),
    [
        ("block_device_mapping_v2: {volume_size: 1}", "block_device_mapping_v2"),
        ("block_device_mapping_v2: [volume_size]", "block_device_mapping_v2[0]"),
        ("block_device_mapping: [{volume_size: 0}]", "block_device_mapping[0].volume_size"),
        ("block_device_mapping_v2: [{volume_size: big}]", "block_device_mapping_v2[0].volume_size"),
    ],
)
def test_a_bad_block_device_mapping_is_named(mapping: str, field: str) -> None:
    template = hot(f"vm: {{type: OS::Nova::Server, properties: {{flavor: m1.tiny, {mapping}}}}}\n")
    assert refusal(template) == f"template.resources.vm.properties.{field}"


def nested(
    text: str, files: dict[str, str], **parameters: str
) -> tuple[list[dict[str, object]], list[str]]:
    return reservations_from_template(text, parameters, FLAVORS, files)


def test_a_nested_stack_from_files_is_expanded_with_its_parameters_and_counts() -> None:
    reservations, warnings = nested(
        hot(
            """
            web:
              type: OS::Heat::ResourceGroup
              properties:
                count: 2
                resource_def: {type: server.yaml, properties: {flavor: m1.small, disk: 10}}
            db: {type: server.yaml, properties: {disk: {get_param: db_disk}}}
        """,
            "db_disk: {type: number, default: 50}\n",
        ),
        {"server.yaml": SERVER},
    )
    assert reservations == [
        {"resource_type": "virtual:instance", "amount": 2, "vcpus": 1, "memory_mb": 2048,
         "disk_gb": 20},
        {"resource_type": "virtual:instance", "amount": 1, "vcpus": 1, "memory_mb": 512,
         "disk_gb": 1},
        {"resource_type": "virtual:volume", "size_gb": 10, "amount": 2},
        {"resource_type": "virtual:volume", "size_gb": 50, "amount": 1},
        {"resource_type": "virtual:floatingip", "network_id": "ext-net", "amount": 3},
    ]  # fmt: skip
    assert warnings == [
        "web/port: resource type OS::Neutron::Port is not reserved",
        "db/port: resource type OS::Neutron::Port is not reserved",
    ]


def test_os_heat_stack_takes_its_template_inline_or_from_files() -> None:
    inner = hot("v: {type: OS::Cinder::Volume, properties: {size: {get_param: size}}}\n")
    reservations, warnings = nested(
        hot("""
            inline:
              type: OS::Heat::Stack
              properties: {template: {get_param: body}, parameters: {size: 7}}
            filed:
              type: OS::Heat::Stack
              properties: {template: {get_file: disk.yaml}, parameters: {size: 7}}
            lost:
              type: OS::Heat::Stack
              properties: {template: {get_file: missing.yaml}}
        """).replace("{get_param: body}", repr(inner).replace("'", '"')),
        {"disk.yaml": inner},
    )
    assert reservations == [{"resource_type": "virtual:volume", "size_gb": 7, "amount": 2}]
    assert warnings == ["lost: nested template missing.yaml is not in files; not reserved"]


def test_a_nested_type_not_in_files_is_warned_about() -> None:
    reservations, warnings = nested(
        hot("""
            vm: {type: OS::Nova::Server, properties: {flavor: m1.tiny}}
            app: {type: app.yaml}
            remote: {type: "https://example.com/templates/db.template"}
        """),
        {},
    )
    assert [r["resource_type"] for r in reservations] == ["virtual:instance"]
    assert warnings == [
        "app: nested template app.yaml is not in files; not reserved",
        "remote: nested template https://example.com/templates/db.template is not in files; "
        "not reserved",
    ]


def chain(depth: int) -> dict[str, str]:
    """level0.yaml names level1.yaml ... down to a volume at ``level{depth - 1}.yaml``."""
    files = {
        f"level{i}.yaml": hot(f"next: {{type: level{i + 1}.yaml}}\n") for i in range(depth - 1)
    }
    files[f"level{depth - 1}.yaml"] = hot("v: {type: OS::Cinder::Volume, properties: {size: 1}}\n")
    return files


@pytest.mark.parametrize(
    ("files", "field", "message"),
    [
        ({"a.yaml": "[unclosed"}, "files.a.yaml", "not YAML"),
        ({"a.yaml": "just text"}, "files.a.yaml", "HOT"),
        ({"a.yaml": "resources: {}"}, "files.a.yaml.heat_template_version", "not a HOT"),
        (
            {"a.yaml": hot("b: {type: b.yaml}\n"), "b.yaml": hot("a: {type: a.yaml}\n")},
            "files.a.yaml",
            "cycle: a.yaml -> b.yaml -> a.yaml",
        ),
        ({"a.yaml": hot("me: {type: a.yaml}\n")}, "files.a.yaml", "cycle: a.yaml -> a.yaml"),
        (
            {"a.yaml": hot("vm: {type: OS::Nova::Server, properties: {flavor: m9.huge}}\n")},
            "files.a.yaml.resources.vm.properties.flavor",
            "m9.huge",
        ),
        (
            {"a.yaml": hot("vm: {type: OS::Nova::Server, properties: {flavor: {get_param: f}}}\n")},
            "template.resources.top.properties.f",
            "files.a.yaml.resources.vm.properties.flavor",
        ),
    ],
)
def test_a_bad_nested_template_names_its_file(
    files: dict[str, str], field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        nested(hot("top: {type: a.yaml}\n"), files)
    assert (refused.value.field, message in refused.value.message) == (field, True)


def test_nested_stacks_go_at_most_five_deep() -> None:
    top = hot("top: {type: level0.yaml}\n")
    reservations, _ = nested(top, chain(5))
    assert reservations == [{"resource_type": "virtual:volume", "size_gb": 1, "amount": 1}]
    with pytest.raises(InvalidInput) as refused:
        nested(top, chain(6))
    assert refused.value.field == "files.level5.yaml"
    assert "deeper than 5" in refused.value.message


def test_resource_groups_go_at_most_five_deep_even_a_group_that_is_its_own_definition() -> None:
    def group(inside: str) -> str:
        properties = f"{{count: 2, resource_def: {inside}}}"
        return f"{{type: OS::Heat::ResourceGroup, properties: {properties}}}"

    five = "{type: OS::Nova::Server, properties: {flavor: m1.tiny}}"
    for _ in range(5):
        five = group(five)
    reservations, _ = translate(hot(f"g: {five}\n"))
    assert [r["amount"] for r in reservations] == [32]
    assert refusal(hot(f"g: {group(five)}\n")).endswith(".resource_def")
    # A YAML alias makes the group its own resource_def: refused, not endless.
    looped = hot(
        """
        g: &g
          type: OS::Heat::ResourceGroup
          properties: {count: 2, resource_def: *g}
        """
    )
    assert refusal(looped) == "template.resources.g" + ".properties.resource_def" * 6


def test_expansion_is_bounded() -> None:
    wide = "".join(f"r{i}: {{type: next.yaml}}\n" for i in range(100))
    volume = "{type: OS::Cinder::Volume, properties: {size: 1}}"
    leaf = "".join(f"v{i}: {volume}\n" for i in range(101))
    with pytest.raises(InvalidInput, match="more than 10000 resources"):
        nested(hot(wide), {"next.yaml": hot(leaf)})


def test_nested_files_over_http_and_the_cli(live_sqlite: LiveServer, tmp_path: Path) -> None:
    url = ("--url", live_sqlite.url)
    size = ("--extra", "vcpus=8", "--extra", "memory_mb=16384", "--extra", "local_gb=200")
    run("host", "create", "h1", *size, *url)
    run("volume-pool", "create", "ssd", "--capacity-gb", "100", *url)
    run("floatingip", "create", "ext-net", "172.24.4.10", *url)
    run("floatingip", "create", "ext-net", "172.24.4.11", *url)
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        hot("""
            web:
              type: OS::Heat::ResourceGroup
              properties: {count: 2, resource_def: {type: server.yaml, properties: {disk: 10}}}
            extra: {type: other.yaml}
        """)
    )
    server = tmp_path / "server.yaml"
    server.write_text(SERVER)
    window = ("--start", WINDOW["start_date"], "--end", WINDOW["end_date"])
    done = run(
        "lease", "create", "nested", "--from-template", str(stack), *window, *url,
        "--template-file", f"server.yaml={server}",
    )  # fmt: skip
    assert "2 x 1 vCPU" in done.stdout and "2 x 10 GB" in done.stdout
    assert "warning: extra: nested template other.yaml is not in files" in done.stderr
    assert "warning: web/port: resource type OS::Neutron::Port" in done.stderr
    [lease] = run_json("lease", "list", *url)
    assert lease["name"] == "nested"

    server.write_text("heat_template_version: 2018-08-31\nresources: [not, a, mapping]\n")
    bad = run(
        "lease", "create", "bad", "--from-template", str(stack), *window, *url,
        "--template-file", f"server.yaml={server}", ok=False,
    )  # fmt: skip
    assert "error (400)" in bad.stderr and "files.server.yaml.resources" in bad.stderr
    unreadable = run(
        "lease", "create", "bad", "--from-template", str(stack), *window, *url,
        "--template-file", f"server.yaml={tmp_path / 'missing.yaml'}", ok=False,
    )  # fmt: skip
    assert "--template-file" in unreadable.stderr and "missing.yaml" in unreadable.stderr
    with httpx.Client(base_url=f"{live_sqlite.url}/v1", timeout=30) as http:
        body = {"name": "x", **WINDOW, "template": stack.read_text(), "files": {"a": 1}}
        refused = http.post("/leases/from-template", json=body)
        assert refused.status_code == 400 and refused.json()["error_message"].startswith("files.a")
        refused = http.post("/leases/from-template", json={**body, "files": ["a"]})
        assert refused.status_code == 400 and refused.json()["error_message"].startswith("files")
    assert [lease["name"] for lease in run_json("lease", "list", *url)] == ["nested"]


def test_groups_that_multiply_past_the_largest_amount_name_the_counts_written() -> None:
    inner = "{type: OS::Heat::ResourceGroup, properties: {count: 50000, resource_def: %s}}"
    server = "{type: OS::Nova::Server, properties: {flavor: m1.tiny}}"
    outer = "{type: OS::Heat::ResourceGroup, properties: {count: 50000, resource_def: %s}}"
    with pytest.raises(InvalidInput) as refused:
        translate(hot(f"g: {outer % (inner % server)}\n"))
    counts = "template.resources.g.properties.count"
    nested_count = "template.resources.g.properties.resource_def.properties.count"
    assert refused.value.field == nested_count
    assert counts in refused.value.message and "2500000000 servers" in refused.value.message
    assert "2147483647" in refused.value.message

    # Two groups each within the limit, the same flavor: the one that tips the total over.
    half = "{type: OS::Heat::ResourceGroup, properties: {count: 1500000000, resource_def: %s}}"
    with pytest.raises(InvalidInput) as refused:
        translate(hot(f"a: {half % server}\nb: {half % server}\n"))
    assert refused.value.field == "template.resources.b.properties.count"
    assert "1500000000 servers" in refused.value.message and "3000000000" in refused.value.message

    # Through a nested stack: the group count in the parent is named.
    volume = "{type: OS::Cinder::Volume, properties: {size: 1}}"
    volumes = hot(f"v: {inner % volume}\n")
    with pytest.raises(InvalidInput) as refused:
        nested(hot(f"s: {outer % '{type: vol.yaml}'}\n"), {"vol.yaml": volumes})
    assert refused.value.field == "files.vol.yaml.resources.v.properties.count"
    assert "template.resources.s.properties.count x" in refused.value.message
    assert "2500000000 volumes" in refused.value.message


def test_a_template_past_the_largest_amount_is_a_400_naming_its_count(live: LiveServer) -> None:
    group = "{type: OS::Heat::ResourceGroup, properties: {count: 60000, resource_def: %s}}"
    server = "{type: OS::Nova::Server, properties: {flavor: m1.tiny}}"
    body = {"name": "huge", **WINDOW, "template": hot(f"g: {group % (group % server)}\n")}
    with httpx.Client(base_url=f"{live.url}/v1", timeout=30) as http:
        refused = http.post("/leases/from-template", json=body)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error_message"]
    assert message.startswith("template.resources.g.properties.resource_def.properties.count")
    assert "reservations[0]" not in message
