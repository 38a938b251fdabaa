"""The `Nats-Msg-Id`s of what the daemon appends: the same write, retried or repeated, is stored once.

JetStream drops a message whose id it stored within its duplicate window and
answers with the first copy's sequence. So every id here is a function of
what the write *is*, never of when it was sent:

- a decision: `epoch:cycle:index:digest` of the cycle that took it, so a
  retried append of a cycle stores nothing twice, and a different decision
  (another digest) is never mistaken for it;
- a fact about a job (`fact_id`): named by what it says, so the same fact
  reported by two terms' adapters is stored once;
- any other fact: numbered per term and replica (`term_fact_id`), so a retry
  reuses its id and nothing else does;
- a leadership announcement: its epoch and holder.

Ids pass through `events.store.msg_id_token` (the store's one rule for what a
header may hold) when appended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from muster.events.codec import encode
from muster.events.store import msg_id_token
from muster.events.types import Event, JobCancelled, JobFailed, JobFinished, JobStarted, JobSubmitted

__all__ = ["decision_ids", "fact_id", "leader_id", "term_fact_id"]


def decision_ids(events: Sequence[Event]) -> list[str]:
    """The ids of one cycle's decisions, in order."""
    ids = []
    for i, ev in enumerate(events):
        digest = hashlib.sha256(encode(ev)).hexdigest()[:16]
        ids.append(f"{getattr(ev, 'epoch', 0)}:{getattr(ev, 'cycle', 0)}:{i}:{digest}")
    return ids


def fact_id(event: Event) -> str | None:
    """The msg id a fact is its own witness of, or None when its content does not identify it.

    A job is submitted once and ends once, and each of its runs starts once (`run`, at its `at`):
    whichever replica or term reports it, the id is the same, so JetStream
    stores it once within its duplicate window. Node facts get per-term ids:
    the same description may come back legitimately (a label set, removed,
    set again within a second).
    """
    if isinstance(event, JobSubmitted):
        return f"fact:submitted:{msg_id_token(event.job)}"
    if isinstance(event, (JobFinished, JobFailed, JobCancelled)):
        return f"fact:ended:{msg_id_token(event.job)}"
    if isinstance(event, JobStarted):
        return f"fact:started:{msg_id_token(event.job)}:{event.run}:{event.at}"
    return None


def term_fact_id(event: Event, identity: str, epoch: int, n: int) -> str:
    """The id of the `n`th fact this replica appends in the term of `epoch`."""
    return fact_id(event) or f"fact:{identity}:{epoch}:{n}"


def leader_id(epoch: int, identity: str) -> str:
    """The id of `identity`'s announcement of `epoch`."""
    return f"leader:{epoch}:{identity}"
