"""JSON answers written by ``climate.jsontext.encode`` (orjson), in place of Starlette's
``json.dumps``: the same bytes but for how a float is spelled, and ``null`` for a float that is
not a number, where Starlette refused it (a 500)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSON

from climate.jsontext import encode


class JSONResponse(_StarletteJSON):
    def render(self, content: Any) -> bytes:
        return encode(content)
