"""What a project is held to and what it consumes: ``GET /v1/policy/usage``."""

from __future__ import annotations

from dataclasses import dataclass

from climate.context import ServiceContext
from climate.domain.actor import Actor
from climate.errors import Forbidden
from climate.fairshare import external
from climate.fairshare.consumption import needed_types, spans
from climate.fairshare.rules import DAY, Kind, Rule, Span, held_over, peak

LOOKAHEAD = 30 * DAY
"""How far ahead a concurrent rule's ``ahead`` figure looks."""


@dataclass(frozen=True)
class Figures:
    rule: Rule
    exempt: bool
    current: float | None
    ahead: float | None


@dataclass(frozen=True)
class Report:
    project_id: str
    user_id: str
    figures: list[Figures]
    external_service: bool


class UsageService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def usage(
        self, actor: Actor, project_id: str | None = None, user_id: str | None = None
    ) -> Report:
        """Every usage rule with the figures of ``project_id`` (the caller's by default; another
        project only for those the ``admin`` rule allows) and, for per-user rules, of
        ``user_id`` (the caller by default).

        :raises Forbidden: another project's usage asked by a member.
        """
        scope = self.ctx.policy.scope(actor)
        project = project_id or actor.project_id
        if scope is not None and project != scope:
            raise Forbidden(f"project_id: only an admin may see the usage of project {project}")
        user = user_id or actor.user_id
        now = self.ctx.clock.now().timestamp()
        rules = self.ctx.settings.rules
        wanted = [r for r in rules if project not in r.exempt_projects]
        back = max((r.window for r in wanted if r.kind == Kind.BUDGET), default=0.0)
        ahead = max([LOOKAHEAD, back])
        users: list[Span] = []
        ours: list[Span] | None = None
        types = needed_types([r for r in wanted if r.kind in (Kind.CONCURRENT, Kind.BUDGET)])
        if types:
            span_ = (now - back, now + ahead)
            with self.ctx.db.reader() as session:
                users, ours = spans(self.ctx, session, project, user, span_, span_, types)
        figures = []
        for rule in rules:
            exempt = project in rule.exempt_projects
            pool = users if rule.per == "user" else ours or []
            mine = [s for s in pool if rule.covers(s.resource_type, s.properties)]
            current = later = None
            if not exempt and rule.kind == Kind.CONCURRENT:
                current = peak(mine, str(rule.unit), now, now + 1)
                later = peak(mine, str(rule.unit), now, now + LOOKAHEAD)
            elif not exempt and rule.kind == Kind.BUDGET:
                current = held_over(mine, str(rule.unit), now - rule.window, now) / DAY
                later = held_over(mine, str(rule.unit), now, now + rule.window) / DAY
            figures.append(Figures(rule, exempt, current, later))
        asked = bool(external.endpoint(self.ctx.settings, "check-create"))
        return Report(project, user, figures, asked)
