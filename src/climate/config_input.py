"""How settings are read and complained about: the ``[climate]`` table of a TOML file, and
pydantic's validation errors in the words of the rest of Climate's errors."""

from __future__ import annotations

import tomllib
from typing import Any

from pydantic_core import ErrorDetails

from climate.errors import InvalidInput


def read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle).get("climate", {})
    except OSError as exc:
        raise InvalidInput("config", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput("config", f"{path} is not valid TOML: {exc}") from exc
    if not isinstance(table, dict):
        raise InvalidInput("config", f"{path}: [climate] must be a table")
    return table


def problem(error: ErrorDetails) -> str:
    """Pydantic's complaint in the words of the rest of Climate's errors."""
    value, ctx, kind = error.get("input"), error.get("ctx", {}), error["type"]
    wanted = {
        "int_parsing": "an integer",
        "int_type": "an integer",
        "int_from_float": "an integer",
        "float_parsing": "a number",
        "float_type": "a number",
        "finite_number": "a finite number",
        "bool_parsing": "true or false",
        "bool_type": "true or false",
        "string_type": "a string",
        "tuple_type": "a list",
    }
    if kind in wanted:
        return f"must be {wanted[kind]}, not {value!r}"
    if kind == "greater_than":
        return f"must be above {ctx['gt']:g}, not {value!r}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']:g}, not {value!r}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']:g}, not {value!r}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, not {value!r}"
    if kind == "extra_forbidden":
        return "unknown setting"
    if kind == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return f"{error['msg']}, not {value!r}"
