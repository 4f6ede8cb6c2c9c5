"""Log lines as text or as JSON objects (``log_format``), and the access log's logger."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from climate.config import Settings

ACCESS = logging.getLogger("climate.access")
ACCESS_FIELDS = ("method", "path", "route", "status", "duration_ms", "client")
"""Extra fields of an access log record: in JSON lines as keys, in text after the message."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ACCESS_FIELDS:
            if hasattr(record, name):
                line[name] = getattr(record, name)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(settings: Settings, *, verbose: bool = False) -> None:
    """Root logging as the settings say: replaces whatever handler was set before, so a worker
    process (``climate api --workers N``) logs as its parent does."""
    handler = logging.StreamHandler()
    formatter = JsonFormatter() if settings.log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # Neither format shows where a line was logged from, nor the thread or process: skip
    # gathering them for every record (the logging HOWTO's "Optimization"); the service logs
    # two lines per admission, and finding the caller walked the stack for each.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    ACCESS.disabled = not settings.access_log
