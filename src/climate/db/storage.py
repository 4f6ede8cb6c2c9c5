"""Why the database cannot store a change: its disk full, or it read-only. Both last until an
operator acts, and both leave the database as it was (the transaction is not committed), so the
API answers them in words and the manager waits them out."""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from sqlalchemy.exc import DBAPIError

DISK_FULL = "disk full"
READ_ONLY = "database is read-only"
SQLITE_FULL = "SQLITE_FULL"
SQLITE_READONLY = "SQLITE_READONLY"
SQLITE_IOERR = "SQLITE_IOERR"
PG_DISK_FULL = "53100"
PG_READ_ONLY = "25006"


def storage_problem(exc: BaseException, sqlite_file: str | None) -> str | None:
    """``disk full: ...`` or ``database is read-only: ...`` when ``exc`` is the database
    failing to store a change for that reason, else None. ``sqlite_file`` is the database's
    file (None for PostgreSQL): SQLite names a full disk, but a filesystem made read-only under
    it (mounted again read-only after errors) is only a ``disk I/O error`` to it, so its
    filesystem is looked at."""
    if not isinstance(exc, DBAPIError):
        return None
    if sqlite_file is None:
        state = getattr(exc.orig, "sqlstate", None)
        if state == PG_DISK_FULL:
            return f"{DISK_FULL}: the database server has no space left to write"
        if state == PG_READ_ONLY:
            return f"{READ_ONLY}: the server accepts no writes (a standby, or read-only mode)"
        return None
    name = str(getattr(exc.orig, "sqlite_errorname", ""))
    if not name.startswith((SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR)):
        return None
    folder = os.path.dirname(os.path.abspath(sqlite_file))
    refused = _write_refused(folder)
    if refused == errno.EROFS:
        return f"{READ_ONLY}: its filesystem ({folder}) is read-only"
    if refused in (errno.EACCES, errno.EPERM) or (
        name.startswith(SQLITE_READONLY) and not os.access(sqlite_file, os.W_OK)
    ):
        return f"{READ_ONLY}: {sqlite_file} or its folder may not be written (permissions)"
    if name.startswith(SQLITE_FULL) or refused in (errno.ENOSPC, errno.EDQUOT):
        return f"{DISK_FULL}: no space left on the filesystem of {sqlite_file}"
    return None


def _write_refused(folder: str) -> int | None:
    """The errno of creating a file in ``folder``, None if it can be: a filesystem the kernel
    made read-only after errors keeps its mount flags (statvfs, access() say nothing) and
    refuses every write."""
    probe = os.path.join(folder, f".climate-write-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:
        return exc.errno
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None
