"""The framework's floor: the least a FastAPI service on Climate's stack does per admission.

Same uvicorn, uvloop and httptools as ``climate serve``; SQLite with Climate's pragmas (WAL,
``synchronous=NORMAL``); per request one indexed read (is the key taken?) and one insert, in one
transaction. ``python -m bench --scenario limit`` serves it beside Climate and compares.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

DB_PATH_VARIABLE = "CLIMATE_FLOOR_DB"

app = FastAPI()
_local = threading.local()


class Booking(BaseModel):
    name: str
    resource: int
    start: str
    end: str


def _connection() -> sqlite3.Connection:
    conn: sqlite3.Connection | None = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(os.environ[DB_PATH_VARIABLE], isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bookings (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "resource INTEGER NOT NULL, start TEXT NOT NULL, end TEXT NOT NULL)"
        )
        conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS bookings_name ON bookings (name)")
        _local.conn = conn
    return conn


@app.post("/bookings", status_code=201)
def book(booking: Booking) -> dict[str, Any]:
    conn = _connection()
    conn.execute("BEGIN IMMEDIATE")
    try:
        taken = conn.execute("SELECT 1 FROM bookings WHERE name = ?", (booking.name,)).fetchone()
        if taken is not None:
            raise HTTPException(409, f"name {booking.name!r} is taken")
        cursor = conn.execute(
            "INSERT INTO bookings (name, resource, start, end) VALUES (?, ?, ?, ?)",
            (booking.name, booking.resource, booking.start, booking.end),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"booking": {"id": cursor.lastrowid, **booking.model_dump()}}
