"""The dashboard's HTTP server: static pages, JSON per page, and server-sent events when the log grows.

Role: the thin shell between a browser and `pages` (aiohttp, already a
dependency of the daemon's endpoints). Every route is a GET: the dashboard
reads the log and never writes it.

Invariants:
- Bound to 127.0.0.1 unless configured; a dashboard on any other address
  needs a bearer token (`exposure_problem`, the one rule `muster ui` and the
  daemon both apply). With a token every request must carry it: an
  `Authorization: Bearer` header, or the cookie that opening `/?token=...`
  once sets (a browser's EventSource cannot send headers).
- `?at=POINT` takes the points of `muster replay --at` (sequence, `@seconds`,
  a date and time, `end`); a bad one is a 400 with the reason, never a 500.
- `/api/events` sends `{"seq", "ready", "books", "books_ready"}` whenever the
  fold or the books advance (at most twice a second) and a comment every
  15 s, so proxies keep it open.
"""

from __future__ import annotations

import hmac
import importlib.resources
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiohttp import web

from muster.events.store import EventStore
from muster.projections.ratecard import RateCard
from muster.replay.cliutil import UsageError, refuse_past_end
from muster.replay.explaincli import not_yet_submitted
from muster.replay.points import Point, PointError, parse_point
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import NatsSnapshots, default_bucket
from muster.replay.source import NatsLog
from muster.ui import pages
from muster.ui.feed import Feed, Moment, SharedFold

COOKIE = "muster_ui_token"
STATIC = ("index.html", "app.js", "style.css")
TYPES = {"html": "text/html", "js": "text/javascript", "css": "text/css"}
PUSH_INTERVAL = 0.5
KEEPALIVE = 15.0
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"
"""Scripts from the package only; the pages colour elements with inline styles."""

FEED: web.AppKey[Feed] = web.AppKey("feed", Feed)
RATES: web.AppKey[RateCard | None] = web.AppKey("rates", object)  # type: ignore[arg-type]
TOKEN: web.AppKey[str | None] = web.AppKey("token", object)  # type: ignore[arg-type]
STOPPING: web.AppKey[anyio.Event] = web.AppKey("stopping", anyio.Event)


def exposure_problem(host: str, token: str | None) -> str | None:
    """Why the dashboard may not listen on `host` as configured (a non-loopback address needs a token), or None."""
    if token:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (
        f"the dashboard would listen on {host}, beyond this machine, without a token: "
        "give one (--token-file, $MUSTER_UI_TOKEN, the chart's ui.tokenSecret) or listen on 127.0.0.1"
    )


def read_token(path: str | None, env_value: str | None) -> str | None:
    """The bearer token from a file (first line, stripped) or the environment; None when neither gives one."""
    if path:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
        if not token:
            raise ValueError(f"{path} holds no token")
        return token
    return env_value.strip() if env_value and env_value.strip() else None


# ---------------------------------------------------------------- requests


def _asset(name: str) -> bytes:
    return importlib.resources.files("muster.ui").joinpath("static", name).read_bytes()


def _moment_point(request: web.Request, feed: Feed) -> Point:
    """The point `?at=` names; a time past the last event folded is refused (400) as the commands refuse it: its
    pages would be told as of a time the log never reached (`Moment.now`). A sequence past it shows the end."""
    text = request.query.get("at", "end")
    try:
        point = parse_point(text)
        if point.time is not None:
            refuse_past_end(feed.source.name, point, "?at=", (feed.seq, feed.state.now))
    except (PointError, UsageError) as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None
    return point


def _json(doc: Any) -> web.Response:
    return web.Response(body=pages.dumps(doc), content_type="application/json")


Page = Callable[[web.Request, Feed, Moment], Awaitable[Any]]


def page(build: Page, *, books: bool = False) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A JSON route: the moment `?at=` names, the page's document, and the header every page shows.

    Until the fold has caught up (and, for a page that reads the books, the
    books too: `books.Books`, filled in behind a shared fold) it answers 503
    with the progress.
    """

    async def handler(request: web.Request) -> web.Response:
        feed = request.app[FEED]
        if not feed.ready.is_set():
            doc = {"header": {"ready": False, "what": "fold", "folded": feed.seq, "target": feed.target}}
            return web.Response(body=pages.dumps(doc), status=503, content_type="application/json")
        if books and not feed.books.ready.is_set():
            doc = {"header": {"ready": False, "what": "books", "folded": feed.books.seq, "target": feed.seq}}
            return web.Response(body=pages.dumps(doc), status=503, content_type="application/json")
        async with feed.at(_moment_point(request, feed)) as moment:
            body = await build(request, feed, moment)
            if body is None:
                raise web.HTTPNotFound(text=f"nothing at {request.path} as of seq {moment.seq}\n")
            return _json({"header": pages.header(feed, moment), "page": body})

    return handler


async def _cluster(request: web.Request, feed: Feed, moment: Moment) -> Any:
    return pages.cluster(moment)


async def _queues(request: web.Request, feed: Feed, moment: Moment) -> Any:
    return pages.queues(moment)


async def _jobs(request: web.Request, feed: Feed, moment: Moment) -> Any:
    q = request.query
    return pages.jobs(moment, text=q.get("q", ""), status=q.get("status", ""), queue=q.get("queue", ""))


async def _job(request: web.Request, feed: Feed, moment: Moment) -> Any:
    job = request.match_info["job"]
    doc = await pages.job(feed, moment, job)
    submitted = feed.books.submissions.get(job, 0)
    if doc is None and submitted > moment.seq and job in feed.state.jobs:
        # a point before its submission is no reason to say there is no such job (as `explain --at`)
        at = request.query.get("at", "end")
        raise web.HTTPNotFound(text=not_yet_submitted(job, at, feed.state.jobs[job].submitted_at) + "\n")
    return doc


async def _chargeback(request: web.Request, feed: Feed, moment: Moment) -> Any:
    return await pages.chargeback(feed, moment, request.app[RATES])


async def _static(request: web.Request) -> web.Response:
    name = request.match_info.get("name", "index.html")
    if name not in STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_asset(name), content_type=TYPES[name.rsplit(".", 1)[1]], charset="utf-8")


async def _index(request: web.Request) -> web.Response:
    token = request.app[TOKEN]
    given = request.query.get("token")
    if token and given is not None and hmac.compare_digest(given, token):
        # the token came in the URL once: keep it in a cookie and drop it from the address bar
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        raise response
    return await _static(request)


async def _events(request: web.Request) -> web.StreamResponse:
    feed, stopping = request.app[FEED], request.app[STOPPING]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    sent: tuple[int, bool, int, bool] | None = None
    written = anyio.current_time()
    try:
        while not stopping.is_set():
            now = (feed.seq, feed.ready.is_set(), feed.books.seq, feed.books.ready.is_set())
            if now != sent:
                doc = {"seq": now[0], "ready": now[1], "books": now[2], "books_ready": now[3]}
                await response.write(b"data: " + pages.dumps(doc) + b"\n\n")
                sent, written = now, anyio.current_time()
            elif anyio.current_time() - written >= KEEPALIVE:
                await response.write(b": keepalive\n\n")
                written = anyio.current_time()
            with anyio.move_on_after(1.0):  # wake to notice a stop, or to keep the stream alive
                await feed.changed()
            await anyio.sleep(PUSH_INTERVAL)  # at most two pushes a second, however fast the log grows
    except (ConnectionResetError, RuntimeError):
        pass  # the browser went away
    return response


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    token = request.app[TOKEN]
    if token and not (request.path == "/" and "token" in request.query):
        given = request.cookies.get(COOKIE, "")
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer ") :].strip()
        if not hmac.compare_digest(given, token):
            raise web.HTTPUnauthorized(
                text="this dashboard needs its token: open /?token=TOKEN once, or send Authorization: Bearer TOKEN\n",
                headers={"WWW-Authenticate": "Bearer"},
            )
    response = await handler(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = CSP
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def make_app(feed: Feed, *, token: str | None = None, rates: RateCard | None = None) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[FEED], app[TOKEN], app[RATES], app[STOPPING] = feed, token, rates, anyio.Event()

    async def stop_streams(app: web.Application) -> None:
        app[STOPPING].set()

    app.on_shutdown.append(stop_streams)
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/api/cluster", page(_cluster))
    app.router.add_get("/api/queues", page(_queues))
    app.router.add_get("/api/jobs", page(_jobs))
    app.router.add_get("/api/jobs/{job:.+}", page(_job, books=True))  # ids hold slashes (team/gang/name)
    app.router.add_get("/api/chargeback", page(_chargeback, books=True))
    app.router.add_get("/api/events", _events)
    return app


async def start_site(runner: web.AppRunner, host: str, port: int) -> int:
    """Serve `runner` on host:port; the port it is bound to (for port 0, the free one the system chose)."""
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = getattr(site, "_server", None)  # aiohttp names the bound socket nowhere public
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else port


async def serve(
    feed: Feed,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    rates: RateCard | None = None,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Fold the log (`feed.run`) and serve the dashboard until cancelled; reports started with the bound port."""
    problem = exposure_problem(host, token)
    if problem is not None:
        raise ValueError(problem)
    runner = web.AppRunner(make_app(feed, token=token, rates=rates), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        bound = await start_site(runner, host, port)
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run)
            task_status.started(bound)
            await anyio.sleep_forever()
    finally:
        with anyio.move_on_after(2, shield=True):
            await runner.cleanup()


async def serve_stream(
    store: EventStore,
    *,
    shared: SharedFold | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    token_file: str | None = None,
    rates: RateCard | None = None,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The dashboard of a stream, followed live (the daemon's and the demo's); reports started with the port.

    With `shared` (the daemon's scheduler loop) the pages show its fold of the
    stream instead of folding it again; points before the fold joined come
    from the stream's stored snapshots (the sidecar's bucket), when it has any.
    """
    token = read_token(token_file, None)
    source = NatsLog(store)
    try:
        stored = await NatsSnapshots.open(store.js, default_bucket(store.stream), create=False)
    except Exception:  # not allowed to read them, NATS trouble: such points are folded from the start
        stored = None
    feed = Feed(source, store, snapshots=None if stored is None else Snapshots(stored, source))
    if shared is not None:
        feed.share(shared)
    await serve(feed, host=host, port=port, token=token, rates=rates, task_status=task_status)
