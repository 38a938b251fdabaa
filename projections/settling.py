"""One instant's scheduling cycles: decide, fold, and decide again until a cycle changes nothing.

A cycle that admits or preempts changes what the next one sees (a preemption
ends its cycle, and the preemptor is admitted by the next one at the same
instant), so its caller folds the decisions and decides again; so does one
that reserves room its holder can take at once (a reservation moved there at
the cycle's end, passing a younger one: `reservations`), and one that gives
held room back (a reservation released at the cycle's end: the fold counts
its room as GPUs freed, which wakes the parked jobs it may serve, and they
are judged at the same instant, as after a job ends); a cycle that only
explains waits, or decides nothing, settles the instant. `muster sim`
(`replay.simulator`) and the daemon (`daemon.cycles`) both run an instant's
cycles as a `Settling`, and `muster audit` expects the cycles it re-derives
by the same rule (`unsettled`), so they take the same decisions for the same
log.

The shells differ only in how a cycle's decisions reach the state: the
simulator folds them at once; the daemon appends them fenced, and a cycle the
fence refused is decided again without counting as decided (it uses one try
of the budget all the same, so a writer that keeps cutting in cannot hold the
loop forever).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from muster.events.types import Event, JobAdmitted, JobPreempted, ReservationMade, ReservationReleased


def unsettled(decisions: Iterable[Event]) -> bool:
    """Whether a cycle's decisions call for another cycle at the same instant: it admitted or preempted,
    reserved room that its holder may take now, or released held room (the jobs its fold wakes may take it)."""
    return any(
        isinstance(ev, (JobAdmitted, JobPreempted, ReservationReleased))
        or (isinstance(ev, ReservationMade) and _starts_now(ev))
        for ev in decisions
    )


def _starts_now(ev: ReservationMade) -> bool:
    return ev.expected_start is not None and ev.expected_start <= ev.at


class Settling:
    """The cycles of one instant, at most `limit`: iterate for each cycle, report its folded decisions.

    settling = Settling(limit)
    for _ in settling:
        decisions = decide(state, now)
        ...fold them...
        settling.decided(decisions)
    if not settling.settled: ...a preemption loop: a bug to report...
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tries = 0
        """Cycles begun (decided or refused)."""
        self.settled = False

    def __iter__(self) -> Iterator[int]:
        while not self.settled and self.tries < self.limit:
            self.tries += 1
            yield self.tries

    def decided(self, decisions: Iterable[Event]) -> None:
        """A cycle's decisions are folded: the instant is settled unless they call for another (`unsettled`)."""
        if not unsettled(decisions):
            self.settled = True
