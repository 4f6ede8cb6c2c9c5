"""JSON as Climate writes it, answers and stored columns alike: orjson's compact UTF-8 text
(``json.dumps`` with ``separators=(",", ":")`` and ``ensure_ascii=False``) at a tenth of its
cost, which showed in an admission's profile. What orjson refuses (an integer beyond 64 bits, a
key that is not a string) goes through ``json.dumps``. Two differences from ``json.dumps``: a
float may be spelled otherwise (``0.00006103515625`` for ``6.103515625e-05``, the same number),
and one that is not a number or is infinite is written as ``null``, where ``json.dumps`` refused
it."""

from __future__ import annotations

import json
from typing import Any

import orjson


def encode(body: Any) -> bytes:
    """``body`` as JSON: pieces encoded alone and joined by ``,`` are the bytes of the whole
    encoded at once (the kept renders of leases and allocations)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def text(value: Any) -> str:
    """``value`` as JSON text (a JSON column's stored value)."""
    return encode(value).decode()
