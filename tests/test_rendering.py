"""JSON answers (``api.rendering.JSONResponse``): orjson's text, byte for byte what Starlette's
``json.dumps`` wrote but for how a float is spelled, and ``json.dumps`` itself where orjson
refuses a value."""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse as StarletteJSON
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.api.rendering import JSONResponse

_SCALARS = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text()
)


def _bodies(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )


@settings(max_examples=300, deadline=None)
@given(_bodies(_SCALARS))
def test_a_body_renders_as_starlette_rendered_it(body: Any) -> None:
    assert JSONResponse(body).body == StarletteJSON(body).body


@settings(max_examples=300, deadline=None)
@given(_bodies(_SCALARS | st.floats(allow_nan=False, allow_infinity=False)))
def test_a_float_may_be_spelled_otherwise_but_reads_back_the_same(body: Any) -> None:
    # 6.103515625e-05 comes out as 0.00006103515625: the same number to every JSON reader.
    assert json.loads(JSONResponse(body).body) == json.loads(StarletteJSON(body).body) == body


def test_what_orjson_refuses_is_rendered_by_json_dumps() -> None:
    huge = {"count": 10**30, 7: "a key that is a number"}
    assert (
        JSONResponse(huge).body
        == StarletteJSON(huge).body
        == b'{"count":' + str(10**30).encode() + b',"7":"a key that is a number"}'
    )


def test_a_float_that_is_not_a_number_renders_as_null() -> None:
    assert JSONResponse({"ratio": math.nan, "cap": math.inf}).body == b'{"ratio":null,"cap":null}'
