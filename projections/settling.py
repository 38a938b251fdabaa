"""One instant's scheduling cycles: decide, fold, and decide again until a cycle changes nothing.

A cycle that admits or preempts changes what the next one sees (a preemption
ends its cycle, and the preemptor is admitted by the next one at the same
instant), so its caller folds the decisions and decides again; so does one
that makes or releases a reservation (`reservations`, decided at the cycle's
end): a release gives back room the jobs it wakes may take now, and a new
reservation changes the view the next cycle's planning judges on (a job that
fitted the free room may no longer), so the instant settles only once the
reservations stand as a new leader or an audit deciding there would leave
them. A cycle that only explains waits, or decides nothing, settles the
instant. `muster sim`
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
    """Whether a cycle's decisions call for another cycle at the same instant: it admitted or preempted, or
    made or released a reservation."""
    return any(isinstance(ev, (JobAdmitted, JobPreempted, ReservationMade, ReservationReleased)) for ev in decisions)


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
