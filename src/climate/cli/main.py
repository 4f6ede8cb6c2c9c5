"""``climate``: run the service, migrate the database, manage tokens, hosts and leases."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from climate.cli import (
    calendar,
    client,
    credits,
    demand,
    inventory,
    reservations,
    series,
    usage,
)
from climate.cli.output import add_format_options, emit, table
from climate.config import Settings, load_settings
from climate.errors import ClimateError, database_words

if TYPE_CHECKING:
    from climate.context import ServiceContext
    from climate.runtime import Workers

# The server side (FastAPI, SQLAlchemy, Alembic) is imported by the commands that use it, so that
# the HTTP client commands start in a fraction of the time.


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        database_url=getattr(args, "database_url", None),
        bind_host=getattr(args, "host", None),
        port=getattr(args, "port", None),
    )


def _serve(args: argparse.Namespace, *, api: bool, manager: bool) -> None:
    from climate import logs
    from climate.serving import metrics_directory

    settings = _settings(args)
    logs.configure(settings, verbose=args.verbose)
    metrics_directory(settings, getattr(args, "workers", 1))  # before climate.metrics is imported

    from climate.runtime import build_context, build_workers, open_database, settle_heap
    from climate.serving import bind

    listener = None
    if api:
        settings.check_bind(settings.bind_host, force=args.allow_noauth_public)
        listener = bind(settings)
    is_sqlite = settings.effective_database_url.startswith("sqlite")
    db = open_database(settings, upgrade=args.command == "serve" or is_sqlite)
    if listener is None:
        workers = build_workers(build_context(settings, db))
        settle_heap()
        _run_manager(workers, db.url)
    elif args.workers > 1:
        _run_api_workers(
            args,
            settings,
            listener,
            build_workers(build_context(settings, db)) if manager else None,
        )
    else:
        ctx = build_context(settings, db)
        _run_api(ctx, listener, build_workers(ctx) if manager else None)


def _run_manager(workers: Workers, url: str) -> None:
    workers.start(watch=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"climate manager running on {url}", flush=True)
    stop.wait()
    workers.stop()


def _run_api_workers(
    args: argparse.Namespace,
    settings: Settings,
    listener: socket.socket,
    manager: Workers | None,
) -> None:
    """``args.workers`` API processes on ``listener``, and ``manager`` (``climate serve``) in
    this process meanwhile, watching for the work they add."""
    from uvicorn.supervisors import Multiprocess

    from climate.serving import ServerConfig

    # Each worker loads its settings again (runtime.app_factory): hand it the same ones.
    os.environ["CLIMATE_DATABASE_URL"] = settings.effective_database_url
    if args.config:
        os.environ["CLIMATE_CONFIG"] = args.config
    config = ServerConfig(
        "climate.runtime:app_factory", settings, factory=True, workers=args.workers
    )
    _print_listening(settings, f"{args.workers} workers")
    if manager is not None:
        manager.start(watch=True)
    try:
        Multiprocess(config, sockets=[listener]).run()
    finally:
        if manager is not None:
            manager.stop()


def _run_api(ctx: ServiceContext, listener: socket.socket, workers: Workers | None) -> None:
    import uvicorn

    from climate.api.app import create_app
    from climate.runtime import settle_heap
    from climate.serving import ServerConfig

    app = create_app(ctx)
    settle_heap()  # once everything long-lived is built: the collector skips it from now on
    server = uvicorn.Server(ServerConfig(app, ctx.settings))
    _print_listening(ctx.settings, str(ctx.db.url))
    if workers is not None:
        workers.start(watch=ctx.db.dialect != "sqlite")
    try:
        server.run(sockets=[listener])
    finally:
        if workers is not None:
            workers.stop()


def _print_listening(settings: Settings, what: str) -> None:
    print(f"climate listening on http://{settings.bind_host}:{settings.port} ({what})", flush=True)


def _db(args: argparse.Namespace) -> None:
    from climate.db import migrate
    from climate.db.engine import Database

    settings = _settings(args)
    db = Database(settings.effective_database_url)
    if args.action == "upgrade":
        migrate.upgrade(db)
    print(f"{db.url}: schema at {migrate.current_revision(db)} (head {migrate.head_revision(db)})")


def _token(args: argparse.Namespace) -> None:
    from climate import wire
    from climate.runtime import build_context, open_database
    from climate.services.tokens import TokenService

    settings = _settings(args)
    db = open_database(settings, upgrade=settings.effective_database_url.startswith("sqlite"))
    tokens = TokenService(build_context(settings, db))
    if args.action == "create":
        expires = None if args.no_expiry else dt.timedelta(days=args.days)
        issued = tokens.issue(args.name, args.user, args.project, args.roles.split(","), expires)
        print(issued.token)
    elif args.action == "list":
        rows = [
            {
                "id": t.id,
                "name": t.name,
                "user": t.user_id,
                "project": t.project_id,
                "roles": t.roles,
                "expires_at": wire.stamp(t.expires_at),
                "revoked_at": wire.stamp(t.revoked_at),
            }
            for t in tokens.list_all()
        ]
        if not emit(args, rows):
            print(table(rows, list(rows[0]) if rows else ["id"]))
    else:
        tokens.revoke(args.id)
        print(f"Revoked token {args.id}")


DEFAULT_TOKEN_DAYS = 90


def _positive_days(text: str) -> int:
    days = int(text) if text.strip().lstrip("+").isdigit() else 0
    if days < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of days above 0, not {text!r} "
            "(--no-expiry makes a token that never expires)"
        )
    return days


def _workers(text: str) -> int:
    workers = int(text) if text.strip().lstrip("+").isdigit() else 0
    if workers < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of processes above 0, not {text!r}"
        )
    return workers


def _import_blazar(args: argparse.Namespace) -> None:
    from climate.backends import load_backend
    from climate.backends.base import Timeboxed
    from climate.runtime import build_context, open_database
    from climate.services.blazar_import import BlazarImportService

    settings = _settings(args)
    db = open_database(settings, upgrade=settings.effective_database_url.startswith("sqlite"))
    backend = Timeboxed(load_backend(settings), settings.backend_timeout_seconds)
    service = BlazarImportService(build_context(settings, db), backend)
    report = service.run(
        args.blazar_url, dry_run=args.dry_run, skip_unmappable=args.skip_unmappable
    )
    if not emit(args, report.as_dict()):
        print("\n".join(report.lines()))


DATABASE_HELP = "the database (default: the settings' database_url, $CLIMATE_DATABASE_URL)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="climate", description=__doc__)
    parser.add_argument("--config", help="TOML settings file (default: $CLIMATE_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("serve", "API and manager in one process (migrates the database first)"),
        ("api", "the HTTP API only"),
        ("manager", "the event manager and notification delivery only"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--database-url", help=DATABASE_HELP)
        if name != "manager":
            p.add_argument("--host", help="listen address (default 127.0.0.1)")
            p.add_argument("--port", type=int, help="listen port (default 1234)")
            p.add_argument(
                "--allow-noauth-public",
                action="store_true",
                help="serve noauth on a non-loopback address anyway",
            )
            p.add_argument("--workers", type=_workers, default=1, help="API processes (default 1)")
    p = sub.add_parser("db", help="database schema")
    p.add_argument(
        "action", choices=["upgrade", "current"], help="migrate to the latest schema, or show it"
    )
    p.add_argument("--database-url", help=DATABASE_HELP)
    p = sub.add_parser("token", help="API tokens for auth = 'token'")
    p.add_argument("--database-url", help=DATABASE_HELP)
    token_actions = p.add_subparsers(dest="action", required=True)
    t = token_actions.add_parser("create", help="issue a token; prints it once")
    t.add_argument("name", help="what the token is for (shown by token list)")
    t.add_argument("--user", required=True, help="the user the token acts as")
    t.add_argument("--project", required=True, help="the project the token acts in")
    t.add_argument("--roles", default="member", help="comma-separated, e.g. admin,member")
    lifetime = t.add_mutually_exclusive_group()
    lifetime.add_argument(
        "--days",
        type=_positive_days,
        default=DEFAULT_TOKEN_DAYS,
        help=f"expire after this many days (default {DEFAULT_TOKEN_DAYS})",
    )
    lifetime.add_argument("--no-expiry", action="store_true", help="a token that never expires")
    t = token_actions.add_parser("list", help="every token: its name, owner, roles and expiry")
    add_format_options(t)
    t = token_actions.add_parser("revoke", help="revoke a token: it is refused from now on")
    t.add_argument("id", help="the token's id (from token list)")
    for action in token_actions.choices.values():
        # Also after the action; SUPPRESS keeps a value given before it.
        action.add_argument("--database-url", default=argparse.SUPPRESS, help=DATABASE_HELP)
    p = sub.add_parser(
        "import-blazar",
        help="import a Blazar database's leases, hosts and floating IPs (docs/blazar-migration.md)",
    )
    p.add_argument(
        "--database-url",
        dest="blazar_url",
        required=True,
        help="Blazar's database, e.g. mysql+pymysql://blazar:PASS@db/blazar",
    )
    p.add_argument(
        "--into",
        dest="database_url",
        help="Climate's database (default: its settings, $CLIMATE_DATABASE_URL)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="report what it would write; write nothing"
    )
    p.add_argument(
        "--skip-unmappable",
        action="store_true",
        help="import without the rows Climate cannot map (the report names them)",
    )
    add_format_options(p)
    client.register(sub)
    reservations.register(sub)
    inventory.register(sub)
    series.register(sub)
    calendar.register(sub)
    usage.register(sub)
    demand.register(sub)
    credits.register(sub)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's ``--help`` opens with the line its parent lists it with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for listed in action._choices_actions:
                child = action.choices[listed.dest]
                if child.description is None:
                    child.description = listed.help
                _describe(child)


def _database_problem(exc: Exception) -> str | None:
    """The database's own words, on one line, when ``exc`` is the database unreachable or
    refusing the work (PostgreSQL not listening or refusing the login, an SQLite file that cannot
    be written): an operator's problem to read, not a traceback. None for anything else."""
    if "sqlalchemy" not in sys.modules:  # the client commands never load it
        return None
    from sqlalchemy.exc import InterfaceError, OperationalError

    if not isinstance(exc, OperationalError | InterfaceError):
        return None
    return database_words(exc)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "serve":
            _serve(args, api=True, manager=True)
        elif args.command == "api":
            _serve(args, api=True, manager=False)
        elif args.command == "manager":
            _serve(args, api=False, manager=True)
        elif args.command == "db":
            _db(args)
        elif args.command == "token":
            _token(args)
        elif args.command == "import-blazar":
            _import_blazar(args)
        else:
            args.func(args)
            sys.stdout.flush()  # here, where a reader gone away is caught below, not at exit
    except ClimateError as exc:
        sys.exit(f"error: {exc.message}")
    except BrokenPipeError:
        # The reader went away (``| head``): what it read is all it wanted. Python would report
        # the pipe again when it flushes stdout at exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception as exc:
        problem = _database_problem(exc)
        if problem is None:
            raise
        sys.exit(f"error: database: {problem}")
