"""The one fencing rule (design.md, invariant 6): which decisions take effect.

Decision events (`events.types.DECISION_TYPES`) carry the epoch of the leader
that took them. A `LeaderElected` takes effect only with an epoch newer than the
last one folded; a decision of an older epoch than that is a deposed leader's
and takes no effect (it stays on the log, counted as fenced). A decision of a
newer epoch than the last election folded is kept: its leader's election may
be appended after it.

Every fold of the log asks these two functions: the cluster fold
(`cluster`), billing (`billing`), the log's invariants (`replay.invariants`)
and the audit (`replay.audit`).
"""

from __future__ import annotations


def fenced(decision_epoch: int, leader_epoch: int) -> bool:
    """Whether a decision of `decision_epoch` is a deposed leader's, the last election folded being `leader_epoch`."""
    return decision_epoch < leader_epoch


def newer_leader(elected_epoch: int, leader_epoch: int) -> bool:
    """Whether a `LeaderElected` of `elected_epoch` takes over from the leader of `leader_epoch`."""
    return elected_epoch > leader_epoch
