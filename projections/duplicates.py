"""The core's answer to a submission of a job id the log already holds: `SubmissionRejected`.

Two adapters (or a retried client past the store's de-duplication window) may submit the
same job id twice. The fold keeps the first job and records the newcomer
(`ClusterState.refused`); each cycle answers every recorded newcomer, naming the job that
holds the id, until its rejection is folded. The answer depends only on the state, so the
daemon, `muster audit` and a new leader refuse the same submissions in the same words.
"""

from __future__ import annotations

from muster.events.types import JobId, QueueName, SubmissionRejected
from muster.projections.state import ClusterState


def refuse_taken_ids(state: ClusterState, now: int, cycle: int, epoch: int) -> list[SubmissionRejected]:
    """A `SubmissionRejected` for each submission of a taken job id, in log order."""
    out = []
    for r in state.refused:
        holder = state.jobs.get(r.job)
        what = f" (queue {holder.queue}, {holder.status})" if holder is not None else ""
        reason = f"job id {r.job!r} is taken by the job on the log{what}; a new submission needs a new id"
        out.append(
            SubmissionRejected(
                at=now, job=JobId(r.job), queue=QueueName(r.queue), reason=reason, cycle=cycle, epoch=epoch
            )
        )
    return out
