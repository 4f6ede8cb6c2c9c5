"""Who may do what: named rules with defaults, each overridable from the operator's policy file.

A rule is an expression over the caller (an ``Actor``) and a target (a mapping such as
``{"project_id": lease.project_id}``), in a subset of oslo.policy's syntax::

    @                          always
    !                          never
    role:admin                 the caller has the role ``admin`` (or a role implying it)
    rule:admin_or_owner        the named rule holds
    project_id:%(project_id)s  the caller's project_id equals the target's project_id
    user_id:alice              the caller's user_id is ``alice``
    not X,  X and Y,  X or Y,  ( X )      (``not`` binds tightest, then ``and``, then ``or``)

The caller's attributes are ``project_id``, ``user_id`` and ``role``. An empty rule is ``@``.
``is_admin:True``, from Blazar's files, never holds: it names oslo.context's internal admin
contexts, and no API caller is one.
Rules are parsed once, when the policy is built: a bad file stops the service at startup.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import yaml

from climate.domain.actor import Actor
from climate.errors import Forbidden, InvalidInput

Target = Mapping[str, object]
Check = Callable[[Actor, Target], bool]

ADMIN = "admin"
"""The rule that decides who sees every project's leases and allocations."""


IMPLIED_ROLES: Mapping[str, frozenset[str]] = {
    "admin": frozenset({"manager"}),
    "manager": frozenset({"member"}),
    "member": frozenset({"reader"}),
}
"""Keystone's default role implications (``openstack implied role list``): Keystone puts the
implied roles into its tokens, and the policy applies them to every caller alike, so that
``X-Roles: member`` from noauth or a Climate token also reads."""


def default_rules(admin_role: str, inventories: Iterable[str] = ()) -> dict[str, str]:
    """Blazar's secure-RBAC defaults (project scope): readers of a project read its leases,
    members also manage them, admins everything; hosts, the other inventories (each item kind's,
    by its rules' prefix in ``inventories``, and volume pools) and the audit log are for admins.
    ``admin_or_owner`` is kept, as in Blazar, for operators' files that still refer to it."""
    prefixes = (*inventories, "climate:volume_pools")
    owner_read = "rule:project_reader_or_admin"
    owner_write = "rule:project_member_or_admin"
    return {
        ADMIN: f"role:{admin_role}",
        "admin_or_owner": "rule:admin or project_id:%(project_id)s",
        "project_member_api": "role:member and project_id:%(project_id)s",
        "project_reader_api": "role:reader and project_id:%(project_id)s",
        "project_member_or_admin": "rule:project_member_api or rule:admin",
        "project_reader_or_admin": "rule:project_reader_api or rule:admin",
        "blazar:leases:get": owner_read,
        "blazar:leases:post": owner_write,
        "blazar:leases:put": owner_write,
        "blazar:leases:delete": owner_write,
        "blazar:oshosts:get": "rule:admin",
        "blazar:oshosts:post": "rule:admin",
        "blazar:oshosts:put": "rule:admin",
        "blazar:oshosts:delete": "rule:admin",
        "blazar:oshosts:get_allocations": owner_read,
        "blazar:oshosts:get_resource_properties": "role:reader or rule:admin",
        "blazar:oshosts:update_resource_properties": "rule:admin",
        **{
            f"{prefix}:{action}": "rule:admin"
            for prefix in prefixes
            for action in ("get", "post", "put", "delete")
        },
        **{f"{prefix}:get_allocations": owner_read for prefix in prefixes},
        "climate:instances:get_allocations": owner_read,
        "climate:audit:get": "rule:admin",
        "climate:usage:get": owner_read,
        "climate:demand:get": owner_read,
        "climate:credits:get": owner_read,
        "climate:credits:grant": "rule:admin",
        "climate:availability:get": "@",
        "climate:leases:retry": "rule:admin",
        "climate:leases:force_end": "rule:admin",
        "climate:leases:confirm": owner_write,
        "climate:leases:start_reservation": owner_write,
        "climate:leases:acknowledge": owner_write,
        "climate:leases:heartbeat": owner_write,
        "climate:leases:idle_exempt": "rule:admin",
        "climate:leases:priority": "rule:admin",
        "climate:series:create": owner_write,
        "climate:series:get": owner_read,
        "climate:series:delete": owner_write,
        "climate:leases:reclaim": owner_write,
    }


class PolicyError(InvalidInput):
    """A policy file that cannot be used: unreadable, an unknown rule name or a bad rule."""

    def __init__(self, rule: str, problem: str) -> None:
        super().__init__(f"policy rule {rule!r}", problem)


class Policy:
    def __init__(self, rules: Mapping[str, str]) -> None:
        self.rules = dict(rules)
        self._checks: dict[str, Check] = {}
        for name, text in self.rules.items():
            self._checks[name] = _Parser(name, text, self.rules, self._checks).parse()
        for name in self.rules:
            _refuse_cycles(name, self.rules, [])

    def allows(self, actor: Actor, rule: str, target: Target | None = None) -> bool:
        return self._checks[rule](actor, target or {})

    def enforce(self, actor: Actor, rule: str, target: Target | None = None) -> None:
        """:raises Forbidden: the rule does not hold for this caller and target."""
        if not self.allows(actor, rule, target):
            raise Forbidden(f"Policy doesn't allow {rule} to be performed")

    def scope(self, actor: Actor) -> str | None:
        """The project the caller's lease and allocation reads are confined to; None when the
        ``admin`` rule holds and every project is visible."""
        return None if self.allows(actor, ADMIN) else actor.project_id


def load_policy(admin_role: str, path: str = "", inventories: Iterable[str] = ()) -> Policy:
    """The defaults (``default_rules``), with the rules of the file at ``path`` (JSON; TOML for
    ``*.toml``; YAML for ``*.yaml``, as Blazar's ``policy.yaml``) in their place. Every rule in
    the file must be one of the known names."""
    rules = default_rules(admin_role, inventories)
    if path:
        for name, text in _read(path).items():
            if name not in rules:
                raise PolicyError(name, f"unknown rule in {path}; known: {', '.join(rules)}")
            if not isinstance(text, str):
                raise PolicyError(name, f"must be a string in {path}, not {text!r}")
            rules[name] = text
    return Policy(rules)


def _read(path: str) -> Mapping[str, object]:
    try:
        raw = Path(path).read_bytes()
        data: object
        if path.endswith(".toml"):
            data = tomllib.loads(raw.decode())
        elif path.endswith((".yaml", ".yml")):
            data = yaml.safe_load(raw)
        else:
            data = json.loads(raw)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise InvalidInput("policy_file", f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput("policy_file", f"{path} must map rule names to rules")
    return data


_TOKEN = re.compile(r"[()]|(?:%\(\w+\)s|[^\s()])+")
_SUBSTITUTION = re.compile(r"%\((\w+)\)s")
_ATTRIBUTES = frozenset({"project_id", "user_id"})


class _Parser:
    """Recursive descent over ``or`` of ``and`` of ``not`` of atoms and parenthesised rules."""

    def __init__(
        self, name: str, text: str, rules: Mapping[str, str], checks: dict[str, Check]
    ) -> None:
        self.name = name
        self.rules = rules
        self.checks = checks
        self.tokens = _TOKEN.findall(text)
        self.at = 0

    def parse(self) -> Check:
        if not self.tokens:
            return _always
        check = self._or()
        if self.at != len(self.tokens):
            raise PolicyError(self.name, f"unexpected {self.tokens[self.at]!r}")
        return check

    def _next(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _or(self) -> Check:
        parts = [self._and()]
        while self._next() == "or":
            self.at += 1
            parts.append(self._and())
        return parts[0] if len(parts) == 1 else lambda a, t: any(p(a, t) for p in parts)

    def _and(self) -> Check:
        parts = [self._not()]
        while self._next() == "and":
            self.at += 1
            parts.append(self._not())
        return parts[0] if len(parts) == 1 else lambda a, t: all(p(a, t) for p in parts)

    def _not(self) -> Check:
        if self._next() == "not":
            self.at += 1
            inner = self._not()
            return lambda a, t: not inner(a, t)
        return self._atom()

    def _atom(self) -> Check:
        token = self._next()
        if token is None:
            raise PolicyError(self.name, "ends where a check was expected")
        self.at += 1
        if token == "(":
            inner = self._or()
            if self._next() != ")":
                raise PolicyError(self.name, "unbalanced parenthesis")
            self.at += 1
            return inner
        if token == "@":
            return _always
        if token == "!":
            return _never
        kind, sep, value = token.partition(":")
        if not sep or not value:
            raise PolicyError(self.name, f"{token!r} is not a check (e.g. role:admin)")
        if kind == "role":
            return lambda a, _t: value in _with_implied(a.roles)
        if kind == "is_admin":
            holds = value.lower() == "false"
            return lambda _a, _t: holds
        if kind == "rule":
            if value not in self.rules:
                raise PolicyError(self.name, f"refers to unknown rule {value!r}")
            checks = self.checks
            return lambda a, t: checks[value](a, t)
        if kind not in _ATTRIBUTES:
            raise PolicyError(
                self.name,
                f"unknown check {kind!r}; use role, rule, project_id, user_id or is_admin",
            )
        return _attribute_check(kind, value)


@functools.lru_cache(maxsize=256)
def _with_implied(roles: frozenset[str]) -> frozenset[str]:
    found = set(roles)
    pending = list(roles)
    while pending:
        for implied in IMPLIED_ROLES.get(pending.pop(), ()):
            if implied not in found:
                found.add(implied)
                pending.append(implied)
    return frozenset(found)


def _attribute_check(kind: str, value: str) -> Check:
    substitution = _SUBSTITUTION.fullmatch(value)
    if substitution is None:
        return lambda a, _t: getattr(a, kind) == value
    key = substitution.group(1)

    def check(actor: Actor, target: Target) -> bool:
        return key in target and getattr(actor, kind) == str(target[key])

    return check


def _always(_actor: Actor, _target: Target) -> bool:
    return True


def _never(_actor: Actor, _target: Target) -> bool:
    return False


def _refuse_cycles(name: str, rules: Mapping[str, str], path: list[str]) -> None:
    if name in path:
        raise PolicyError(name, f"refers to itself through {' -> '.join([*path, name])}")
    for used in re.findall(r"rule:([^\s()]+)", rules[name]):
        _refuse_cycles(used, rules, [*path, name])
