"""When a cycle falls due with no new event: the core's `next_wakeup`, and the replica's clock.

Idle reclaim (and anything else the core schedules by time) needs a cycle at a
time no event announces. The core says when (`next_wakeup(state, after)`,
pure); this module caches that per fold and turns it into how long the loop
may sleep. It is also where the loop reads the clock, once per cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from muster.projections.scheduler import next_wakeup
from muster.projections.state import ClusterState

__all__ = ["WakeTimer"]


class WakeTimer:
    def __init__(self, state: Callable[[], ClusterState], clock: Callable[[], float]) -> None:
        self._state = state
        self.clock = clock
        self.decided_at = 0
        """Event time of the last cycle (the wake-up is asked for after it)."""
        self._key: tuple[int, int] = (-1, -1)
        self._at: int | None = None

    def now(self) -> int:
        """The time a cycle decides at: event time never goes backwards, even if this replica's clock is behind."""
        return max(int(self.clock()), int(self._state().now))

    def next_wake(self) -> int | None:
        """When a cycle falls due with no new event, after the last cycle; cached per fold."""
        state = self._state()
        if state.idle_reclaim is None:
            return None
        key = (state.applied, self.decided_at)
        if key != self._key:
            self._key = key
            self._at = next_wakeup(state, self.decided_at)
        return self._at

    def due(self) -> bool:
        wake = self.next_wake()
        return wake is not None and wake <= self.now()

    def timeout(self, idle: float) -> float:
        """Seconds to wait for an event before a cycle falls due (at most `idle`)."""
        wake = self.next_wake()
        return idle if wake is None else min(idle, max(0.0, wake - self.clock()))
