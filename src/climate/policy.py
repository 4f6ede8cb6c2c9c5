"""Who may do what: named rules with defaults, each overridable from the operator's policy file.

A rule is an expression over the caller (an ``Actor``) and a target (a mapping such as
``{"project_id": lease.project_id}``), in a subset of oslo.policy's syntax::

    @                          always
    !                          never
    role:admin                 the caller has the role ``admin``
    rule:admin_or_owner        the named rule holds
    project_id:%(project_id)s  the caller's project_id equals the target's project_id
    user_id:alice              the caller's user_id is ``alice``
    not X,  X and Y,  X or Y,  ( X )      (``not`` binds tightest, then ``and``, then ``or``)

The caller's attributes are ``project_id``, ``user_id`` and ``role``. An empty rule is ``@``.
Rules are parsed once, when the policy is built: a bad file stops the service at startup.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

from climate.domain.actor import Actor
from climate.errors import Forbidden, InvalidInput

Target = Mapping[str, object]
Check = Callable[[Actor, Target], bool]

ADMIN = "admin"
"""The rule that decides who sees every project's leases and allocations."""


def default_rules(admin_role: str) -> dict[str, str]:
    """The defaults: members manage their own leases and read their own allocations and the
    public host properties; everything about hosts and the audit log is for admins."""
    return {
        ADMIN: f"role:{admin_role}",
        "admin_or_owner": "rule:admin or project_id:%(project_id)s",
        "blazar:leases:get": "rule:admin_or_owner",
        "blazar:leases:post": "rule:admin_or_owner",
        "blazar:leases:put": "rule:admin_or_owner",
        "blazar:leases:delete": "rule:admin_or_owner",
        "blazar:oshosts:get": "rule:admin",
        "blazar:oshosts:post": "rule:admin",
        "blazar:oshosts:put": "rule:admin",
        "blazar:oshosts:delete": "rule:admin",
        "blazar:oshosts:get_allocations": "rule:admin_or_owner",
        "blazar:oshosts:get_resource_properties": "@",
        "blazar:oshosts:update_resource_properties": "rule:admin",
        **{
            f"{prefix}:{action}": "rule:admin"
            for prefix in (
                "blazar:devices",
                "blazar:networks",
                "blazar:floatingips",
                "climate:volume_pools",
            )
            for action in ("get", "post", "put", "delete")
        },
        "blazar:devices:get_allocations": "rule:admin_or_owner",
        "blazar:networks:get_allocations": "rule:admin_or_owner",
        "blazar:floatingips:get_allocations": "rule:admin_or_owner",
        "climate:volume_pools:get_allocations": "rule:admin_or_owner",
        "climate:instances:get_allocations": "rule:admin_or_owner",
        "climate:audit:get": "rule:admin",
        "climate:availability:get": "@",
        "climate:leases:retry": "rule:admin",
        "climate:leases:force_end": "rule:admin",
        "climate:leases:confirm": "rule:admin_or_owner",
        "climate:leases:start_reservation": "rule:admin_or_owner",
        "climate:leases:acknowledge": "rule:admin_or_owner",
        "climate:leases:priority": "rule:admin",
        "climate:series:create": "rule:admin_or_owner",
        "climate:series:get": "rule:admin_or_owner",
        "climate:series:delete": "rule:admin_or_owner",
        "climate:leases:reclaim": "rule:admin_or_owner",
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
            raise Forbidden(f"Policy doesn't allow {rule} to be performed.")

    def scope(self, actor: Actor) -> str | None:
        """The project the caller's lease and allocation reads are confined to; None when the
        ``admin`` rule holds and every project is visible."""
        return None if self.allows(actor, ADMIN) else actor.project_id


def load_policy(admin_role: str, path: str = "") -> Policy:
    """The defaults, with the rules of the file at ``path`` (JSON, or TOML for ``*.toml``) in
    their place. Every rule in the file must be one of the known names."""
    rules = default_rules(admin_role)
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
        data: object = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (OSError, ValueError) as exc:
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
            return lambda a, _t: value in a.roles
        if kind == "rule":
            if value not in self.rules:
                raise PolicyError(self.name, f"refers to unknown rule {value!r}")
            checks = self.checks
            return lambda a, t: checks[value](a, t)
        if kind not in _ATTRIBUTES:
            raise PolicyError(
                self.name, f"unknown check {kind!r}; use role, rule, project_id or user_id"
            )
        return _attribute_check(kind, value)


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
