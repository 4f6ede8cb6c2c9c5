"""/v1/leases/from-template: one lease for everything a Heat stack template needs."""

from __future__ import annotations

from fastapi import APIRouter

from climate import wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep
from climate.api.parsing import json_object
from climate.api.rendering import JSONResponse
from climate.api.schemas import body, validated
from climate.api.schemas.answers import V1, WRITE, answers
from climate.api.schemas.bodies import LeaseFromTemplate
from climate.api.schemas.lease_answers import FromTemplate
from climate.api.schemas.leases import LeaseCreate
from climate.domain.flavors import parse_flavors
from climate.errors import InvalidInput
from climate.services.templates import reservations_from_template

router = APIRouter(prefix="/v1/leases", tags=["leases"])
FIELDS = frozenset(
    {
        "name",
        "start_date",
        "end_date",
        "before_end_date",
        "events",
        "lease_type",
        "priority",
        "retries",
        "deadline",
        "hold",
        "hold_minutes",
        "template",
        "parameters",
        "files",
    }
)
"""A fixed-dates lease body without ``reservations``: the template gives them."""


def _parameters(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("parameters", "must be an object of parameter values")
    for key, given in value.items():
        if isinstance(given, bool):
            raise InvalidInput(
                f"parameters.{key}",
                f"is a boolean ({str(given).lower()}) where a string or number is required",
            )
        if not isinstance(given, str | int | float):
            raise InvalidInput(f"parameters.{key}", f"must be a string or number, not {given!r}")
    return {key: str(given) for key, given in value.items()}


def _files(value: object) -> dict[str, str]:
    """The nested templates, by the name the template gives them, as Heat's ``files``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("files", "must be an object of file name -> template text")
    for name, text in value.items():
        if not isinstance(text, str):
            raise InvalidInput(f"files.{name}", "must be the nested template's YAML text")
    return value


@router.post(
    "/from-template",
    status_code=201,
    openapi_extra=body(LeaseFromTemplate),
    responses=answers(201, FromTemplate, V1 | WRITE),
)
def create_lease_from_template(
    services: ServicesDep, actor: ActorDep, body: BodyDep
) -> JSONResponse:
    """201 with the lease for a HOT ``template`` (its ``parameters`` given as an object, the
    nested templates it names in ``files``) and a warning per resource it does not reserve; the
    other fields are ``POST /v1/leases``'s (fixed dates only)."""
    fields = json_object(body)
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field; allowed: {', '.join(sorted(FIELDS))}")
    template = fields.pop("template", None)
    if not isinstance(template, str):
        raise InvalidInput("template", "required: the HOT template's YAML text")
    flavors = parse_flavors(services.leases.ctx.settings.flavors)
    reservations, warnings = reservations_from_template(
        template,
        _parameters(fields.pop("parameters", None)),
        flavors,
        _files(fields.pop("files", None)),
    )
    if not reservations:
        # A lease may have none (as in Blazar), but a template's lease is for its resources.
        raise InvalidInput("template", f"reserves nothing ({'; '.join(warnings) or 'empty'})")
    request = validated(LeaseCreate, {**fields, "reservations": reservations}).request()
    lease = services.leases.create(actor, request)
    return JSONResponse({"lease": wire.lease(lease), "warnings": warnings}, status_code=201)
