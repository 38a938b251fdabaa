"""The dashboard over HTTP: pages as JSON, points, read-only, the token rule, live updates from the stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from uikit import STORY, memory_log, serving, sim, wait_for, write_jsonl

from muster.cli import main
from muster.events.store import EventStore
from muster.projections.chargeback import HourPoint
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import MemorySnapshots
from muster.replay.source import MemoryLog, NatsLog
from muster.ui import pages
from muster.ui.feed import Feed
from muster.ui.server import exposure_problem


async def get(url: str, **kw: object) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, allow_redirects=False, **kw) as r:  # type: ignore[arg-type]
        return r.status, await r.text()


async def test_each_page_answers_with_the_log_s_numbers() -> None:
    """Cluster, queues, jobs, a job and chargeback answer JSON built from the log, with the header's position."""
    events = sim(STORY).events
    async with serving(Feed(memory_log(events), every=5)) as base:
        status, body = await get(f"{base}/api/queues")
        assert status == 200
        doc = json.loads(body)
        assert doc["header"]["seq"] == len(events) and doc["header"]["live"]
        assert {r["queue"] for r in doc["page"]["rows"]} == {"team-a", "team-b"}
        cluster = json.loads((await get(f"{base}/api/cluster?at=12"))[1])
        assert cluster["header"]["seq"] == 12 and not cluster["header"]["live"]
        assert sum(len(d["nodes_list"]) for d in cluster["page"]["domains"]) == 4
        jobs = json.loads((await get(f"{base}/api/jobs?q=big"))[1])["page"]
        assert [r["job"] for r in jobs["rows"]] == ["b-big"]
        story = json.loads((await get(f"{base}/api/jobs/b-big"))[1])["page"]
        kinds = [ln["kind"] for ln in story["story"]]
        assert kinds[:3] == ["submitted", "admitted", "preempted"] and kinds[-1] == "finished"
        bill = json.loads((await get(f"{base}/api/chargeback"))[1])["page"]
        assert {r["key"] for r in bill["report"]["rows"]} == {"team-a", "team-b"}
        assert bill["report"]["totals"]["lost_gpu_hours"] > 0


async def test_bad_requests_get_a_reason_and_nothing_writes() -> None:
    """A bad point is a 400 naming the accepted forms, an unknown job a 404, any other method a 405."""
    async with serving(Feed(memory_log(sim(STORY).events))) as base:
        status, body = await get(f"{base}/api/cluster?at=yesterday")
        assert status == 400 and "not a point in the log" in body
        assert (await get(f"{base}/api/jobs/nobody"))[0] == 404
        assert (await get(f"{base}/static/../feed.py"))[0] == 404
        async with aiohttp.ClientSession() as http:
            for method in ("POST", "PUT", "DELETE"):
                async with http.request(method, f"{base}/api/queues") as r:
                    assert r.status == 405, method


async def test_a_time_point_is_shown_as_of_that_time_not_of_the_last_event_before_it() -> None:
    """`?at=@300` (last event before it at t=150): the header says t=300, b-big's age is 300 s and its story is
    told as of t=300, as `muster jobs`/`explain --at @300` tell it."""
    async with serving(Feed(memory_log(sim(STORY).events), every=5)) as base:
        for route in ("cluster", "queues", "jobs", "jobs/b-big", "chargeback"):
            header = json.loads((await get(f"{base}/api/{route}?at=@300"))[1])["header"]
            assert (header["seq"], header["at"]) == (19, 300), route
        jobs = json.loads((await get(f"{base}/api/jobs?at=@300"))[1])["page"]
        assert {r["job"]: r["age"] for r in jobs["rows"]}["b-big"] == 300
        queues = json.loads((await get(f"{base}/api/queues?at=@300"))[1])["page"]
        assert queues["history"][-1]["at"] == 300
        story = json.loads((await get(f"{base}/api/jobs/b-big?at=@300"))[1])["page"]
        assert story["status"] == "pending" and story["as_of"] == 300
        # a sequence point is told as of its own last event, as before
        header = json.loads((await get(f"{base}/api/queues?at=19"))[1])["header"]
        assert (header["seq"], header["at"]) == (19, 150)
        # a time the log never reached is refused, as `muster jobs --at` refuses it, not shown as that time
        status, body = await get(f"{base}/api/queues?at=@5000")
        assert status == 400 and "past the end" in body and "t=1540" in body


async def test_a_job_page_before_the_job_s_submission_says_when_it_was_submitted() -> None:
    """b-small's page at seq 12 or @100 (submitted at t=150, seq 18) says it was not yet submitted and when it was,
    as `muster explain --at` does, not "nothing at"; an id the log never held stays a plain 404."""
    async with serving(Feed(memory_log(sim(STORY).events), every=5)) as base:
        for at in ("12", "@100"):
            status, body = await get(f"{base}/api/jobs/b-small?at={at}")
            assert status == 404 and f"b-small was not yet submitted at {at}: it was submitted at t=150" in body
        status, body = await get(f"{base}/api/jobs/nobody?at=12")
        assert status == 404 and "not yet submitted" not in body


async def test_a_token_guards_every_route_and_the_browser_keeps_it_in_a_cookie() -> None:
    """With a token: 401 without it, 200 with the bearer header, and `/?token=` sets a cookie that then works."""
    async with serving(Feed(memory_log(sim(STORY).events)), token="s3cret") as base:
        assert (await get(f"{base}/api/queues"))[0] == 401
        assert (await get(f"{base}/"))[0] == 401
        assert (await get(f"{base}/api/queues", headers={"Authorization": "Bearer wrong"}))[0] == 401
        assert (await get(f"{base}/api/queues", headers={"Authorization": "Bearer s3cret"}))[0] == 200
        # unsafe: aiohttp's jar refuses cookies of IP hosts by default; browsers keep them
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(f"{base}/?token=s3cret", allow_redirects=False) as r:
                assert r.status == 302 and r.headers["Location"] == "/"
            async with http.get(f"{base}/api/queues") as r:
                assert r.status == 200


@pytest.mark.parametrize(
    ("host", "token", "allowed"),
    [
        pytest.param("127.0.0.1", None, True, id="loopback"),
        pytest.param("::1", None, True, id="loopback-v6"),
        pytest.param("localhost", None, True, id="localhost"),
        pytest.param("0.0.0.0", None, False, id="everywhere-without-token"),
        pytest.param("10.1.2.3", None, False, id="lan-without-token"),
        pytest.param("0.0.0.0", "t", True, id="everywhere-with-token"),
    ],
)
def test_only_loopback_goes_without_a_token(host: str, token: str | None, allowed: bool) -> None:
    """Listening beyond this machine needs a token; loopback does not."""
    assert (exposure_problem(host, token) is None) == allowed


def test_the_cli_refuses_an_exposed_dashboard_and_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`muster ui` exits 2 with one line for: no token on 0.0.0.0, an empty token file, a bad rate card, no log."""
    monkeypatch.delenv("MUSTER_UI_TOKEN", raising=False)
    log = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "rates.yaml").write_text("versions: nope\n")
    cases = [
        (["--host", "0.0.0.0"], "without a token"),
        (["--token-file", str(tmp_path / "empty")], "holds no token"),
        (["--rates", str(tmp_path / "rates.yaml")], "--rates"),
        (["--port", "70000"], "not a port number"),
    ]
    for extra, message in cases:
        assert main(["ui", "--log", str(log), *extra]) == 2, extra
        assert message in capsys.readouterr().err
    assert main(["ui", "--log", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


async def test_the_stream_s_new_events_reach_the_page_without_a_reload(store: EventStore) -> None:
    """Following a stream: the event stream announces new sequences and the live page shows the new state."""
    events = sim(STORY).events
    await store.append(events[:6])
    feed = Feed(NatsLog(store), store)
    async with serving(feed) as base, aiohttp.ClientSession() as http, http.get(f"{base}/api/events") as stream:
        first = json.loads((await stream.content.readline()).decode().removeprefix("data: "))
        assert first == {"seq": 6, "ready": True, "books": 6, "books_ready": True}
        await store.append(events[6:])
        line = b""
        while not line.startswith(b"data: ") or json.loads(line[6:])["seq"] < len(events):
            line = await stream.content.readline()

        async def finished() -> bool:
            doc = json.loads((await get(f"{base}/api/jobs"))[1])
            return {r["job"]: r["status"] for r in doc["page"]["rows"]}.get("b-big") == "finished"

        await wait_for(finished, "b-big finished on the live page")


def test_a_long_chargeback_chart_sums_whole_hours_into_at_most_a_week_of_bars() -> None:
    """Thousands of hours become at most `BARS` bars of whole hours; the sums per queue and of capacity stay."""
    hours = [
        HourPoint(hour=h * 3600, allocated_by_queue={"a": 10, "b": h}, capacity_gpu_s=100, used_mgpu_s=1)
        for h in range(0, 1000)
        if h % 7  # with gaps
    ]
    drawn, span = pages.bars(hours)
    assert len(drawn) <= pages.BARS and span == 6
    assert all((p.hour - hours[0].hour) % (span * 3600) == 0 for p in drawn), "whole hours from the first"
    for field in ("capacity_gpu_s", "used_mgpu_s"):
        assert sum(getattr(p, field) for p in drawn) == sum(getattr(p, field) for p in hours)
    for queue in ("a", "b"):
        assert sum(p.allocated_by_queue[queue] for p in drawn) == sum(h.allocated_by_queue[queue] for h in hours)
    assert pages.bars(hours[:100]) == (hours[:100], 1), "a short log keeps its hours"


class HeldStart:
    """A log whose reads from sequence 1 wait for `opened` (the books' reader), the others not (the live fold's)."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.name = log.name
        self.opened = anyio.Event()

    async def last_seq(self) -> int:
        return await self.log.last_seq()

    async def raw(self, seq: int) -> bytes | None:
        return await self.log.raw(seq)

    async def batches(self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None) -> Any:
        if from_seq == 1:
            await self.opened.wait()
        async for batch in self.log.batches(from_seq, to_seq, until=until):
            yield batch


async def test_live_pages_answer_from_a_snapshot_while_the_books_catch_up_behind() -> None:
    """Started from a stored snapshot: the cluster answers at once; chargeback and stories say they wait, then draw."""
    events = sim(STORY).events
    log = HeldStart(memory_log(events))
    snapshots = Snapshots(MemorySnapshots(), log)
    state = ClusterState()
    for ev in events:
        evolve(state, ev)
    await snapshots.write(state, len(events), verified_from=0)
    feed = Feed(log, snapshots=snapshots)
    async with serving(feed) as base:
        assert (await get(f"{base}/api/cluster"))[0] == 200
        status, body = await get(f"{base}/api/chargeback")
        assert status == 503 and json.loads(body)["header"]["what"] == "books"
        assert (await get(f"{base}/api/jobs/b-big"))[0] == 503
        log.opened.set()

        async def books_caught_up() -> bool:
            return (await get(f"{base}/api/chargeback"))[0] == 200

        await wait_for(books_caught_up, "the chargeback once the books caught up")
        assert (await get(f"{base}/api/jobs/b-big"))[0] == 200
