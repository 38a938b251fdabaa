"""Points in the log (`--at`, `--from`, `--to`) and how times read for a person.

A point is a stream sequence or an event time:
- `1234` is sequence 1234 (a file log's line 1234); `end` is the last event;
- `@1714531920` is an event time in seconds: epoch seconds in a daemon's log,
  virtual seconds in a `muster sim` log (`@3600`, also `@1h30m`, `@90s`);
- `2024-05-01T03:12`, `2024-05-01 03:12:07` or with an offset is a wall-clock
  time, local unless it says otherwise.

The state *at a time* T is the fold of the log up to, not including, the first
event later than T (the rule `EventStore.iter_batches(until=)` applies).

Times print in local time for epoch logs and as `t=SECONDS` for sim logs,
with a relative part ("2h 05m ago", "waited 1h 10m"). A log is an epoch log
when its times reach 2001 (10^9 s); no sim runs that long.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

EPOCH_THRESHOLD = 1_000_000_000
"""Event times at or above this are epoch seconds (2001-09-09); below, virtual seconds."""

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


class PointError(ValueError):
    """A point that is neither a sequence, `@SECONDS` nor an ISO datetime."""


@dataclass(frozen=True)
class Point:
    """A sequence (`seq`), an event time (`time`), or the end of the log (neither)."""

    seq: int | None = None
    time: int | None = None
    text: str = "end"

    @property
    def is_end(self) -> bool:
        return self.seq is None and self.time is None


END = Point()


def parse_duration(text: str) -> int:
    """`90`, `90s`, `15m`, `1h30m`, `2d` in seconds."""
    m = _DURATION.match(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise PointError(f"{text!r} is not a duration (examples: 3600, 90s, 15m, 1h30m, 2d)")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def parse_point(text: str) -> Point:
    """Parse `--at`/`--from`/`--to` (see the module docstring); raises PointError."""
    t = text.strip()
    if t in ("end", "last", ""):
        return END
    if t.startswith("seq:"):
        t = t[4:]
    if t.isdigit():
        return Point(seq=int(t), text=text)
    if t.startswith("@"):
        try:
            return Point(time=parse_duration(t[1:]), text=text)
        except PointError:
            # say what a point after @ is, not what a duration is: the user gave a point
            raise PointError(
                f"{text!r} is not an event time: give @ and seconds (@1714531920, or @3600 / @1h in a sim log)"
            ) from None
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise PointError(
            f"{text!r} is not a point in the log: use a sequence (1234), an event time in seconds "
            "(@1714531920, or @3600 / @1h in a sim log) or a local date and time (2024-05-01T03:12)"
        ) from None
    # a naive datetime is local time; astimezone() reads it so
    return Point(time=int(when.astimezone().timestamp()), text=text)


def as_of(point: Point, last_event_at: int) -> int:
    """The time the state at `point` is told as of, by every view of it (`jobs`, `queues`, `replay`,
    `explain`): a time point's own time, as the log up to T is the state *at* T (a job pending then has
    waited until T, not until the last event before it), else the time of the last event folded.

    The log reached T: the commands refuse a time past its last event (`cliutil.check_point`)."""
    return max(last_event_at, point.time) if point.time is not None else last_event_at


# ---------------------------------------------------------------- durations and times


def duration(seconds: int | float) -> str:
    """A compact duration: `45s`, `12m 05s`, `3h 04m`, `2d 5h`."""
    s = round(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s}s"
    m, sec = divmod(s, 60)
    if m < 60:
        return f"{sign}{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{sign}{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d {h}h"


def gpu_hours(gpu_seconds: int | float) -> str:
    return f"{gpu_seconds / 3600:,.1f}"


@dataclass(frozen=True)
class Clock:
    """How event times print: local wall-clock time (epoch logs) or `t=` seconds (sim logs).

    `now` is the wall-clock time "ago" is measured from (epoch logs only); it is
    passed in, so output is reproducible in tests.
    """

    epoch: bool
    now: int | None = None

    @classmethod
    def for_log(cls, last_at: int, now: int | None = None) -> Clock:
        return cls(epoch=last_at >= EPOCH_THRESHOLD, now=now)

    def at(self, t: int | None) -> str:
        """The time itself: `2024-05-01 03:12:07` or `t=3600`."""
        if t is None:
            return "-"
        if self.epoch:
            return dt.datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        return f"t={t}"

    def when(self, t: int | None) -> str:
        """The time with its distance from now (epoch logs) or from the start (sim logs)."""
        if t is None:
            return "-"
        if self.epoch:
            if self.now is None:
                return self.at(t)
            delta = self.now - t
            rel = f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"
            return f"{self.at(t)} ({rel})"
        return f"t={t} ({duration(t)})" if t >= 60 else f"t={t}"

    def iso(self, t: int | None) -> str | None:
        """ISO 8601 in local time for JSON output (None in sim logs, whose times are not dates)."""
        if t is None or not self.epoch:
            return None
        return dt.datetime.fromtimestamp(t).astimezone().isoformat()
