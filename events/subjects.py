"""Subjects of the log: where each event is published, and which subjects an event counts on.

Role: `<prefix>.<kind>.<id>` for every event (`subject_for`), tokens made safe
for NATS (`subject_token`), and the rule readers apply to every message
(`subject_problem`): an event counts only on its own subjects, so NATS
permissions on subjects are permissions on what the events say.
"""

from __future__ import annotations

import hashlib
import re

from muster.events.types import (
    CohortConfigured,
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobHeld,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobReleased,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PriorityClassConfigured,
    QueueConfigured,
    ReservationMade,
    ReservationReleased,
    SchedulerConfigured,
    SubmissionRejected,
)

__all__ = ["DEFAULT_PREFIX", "SubjectRule", "subject_for", "subject_problem", "subject_token"]

DEFAULT_PREFIX = "muster"

_SAFE = re.compile(r"[A-Za-z0-9_\-/:=@+]+")
_MAX_TOKEN = 128


def subject_token(value: str) -> str:
    """`value` as one subject token: deterministic, injective, ASCII, no `.`, `*`, `>` or whitespace.

    Safe characters pass through; every other UTF-8 byte becomes `%XX`. An empty
    value is `%`; a token longer than 128 characters is cut and suffixed with
    `~` and a hash of the whole value.
    """
    if not value:
        return "%"
    if _SAFE.fullmatch(value) and len(value) <= _MAX_TOKEN:
        return value
    parts: list[str] = []
    for ch in value:
        if _SAFE.fullmatch(ch):
            parts.append(ch)
        else:
            parts.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    token = "".join(parts)
    if len(token) > _MAX_TOKEN:
        token = token[:100] + "~" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:24]
    return token


# the events about one job: published on `job.<id>`, by the daemon's identity only
_JOB_EVENTS = (
    JobCancelled,
    JobHeld,
    JobReleased,
    JobStarted,
    JobFinished,
    JobFailed,
    JobAdmitted,
    JobPreempted,
    JobInadmissible,
    JobRejected,
    SubmissionRejected,
    ReservationMade,
    ReservationReleased,
    GpuUtilizationSampled,
)


def _route(event: Event) -> tuple[str, str]:
    """(kind, id) of an event's subject; a submission's id is `<queue>.<job>`."""
    if isinstance(event, _JOB_EVENTS):
        return "job", subject_token(event.job)
    match event:
        case JobSubmitted():
            return "submit", f"{subject_token(event.queue)}.{subject_token(event.job)}"
        case NodeAdded() | NodeUpdated() | NodeRemoved() | NodeCordoned():
            return "node", subject_token(event.node)
        case QueueConfigured():
            return "queue", subject_token(event.name)
        case CohortConfigured():
            return "cohort", subject_token(event.name)
        case PriorityClassConfigured():
            return "priorityclass", subject_token(event.name)
        case SchedulerConfigured():
            return "scheduler", "config"
        case LeaderElected():
            return "leader", subject_token(event.holder)
    return "other", subject_token(type(event).__name__)


def subject_for(event: Event, prefix: str = DEFAULT_PREFIX) -> str:
    """`<prefix>.<kind>.<id>` for an event (`<prefix>.submit.<queue>.<job>` for a submission)."""
    kind, ident = _route(event)
    return f"{prefix}.{kind}.{ident}"


_KIND: dict[type, bytes] = {
    JobSubmitted: b"submit",
    **{t: b"job" for t in _JOB_EVENTS},
    **{t: b"node" for t in (NodeAdded, NodeUpdated, NodeRemoved, NodeCordoned)},
    QueueConfigured: b"queue",
    CohortConfigured: b"cohort",
    PriorityClassConfigured: b"priorityclass",
    SchedulerConfigured: b"scheduler",
    LeaderElected: b"leader",
}


def subject_problem(subject: bytes, event: Event) -> str | None:
    """Why `event` must not be taken from `subject` (None when it may), whatever the prefix.

    Each kind of event has its own subjects, and NATS permissions say who may
    publish where (deploy/nats/accounts.conf): only the daemon publishes on
    `job.*`, a team only on `submit.<its queue>.*`. So a job event counts only
    on `<kind>.<id>` subjects of its kind, and a submission only on the
    `submit.<queue>.<job>` subject of its own queue and job, or on `job.<id>`
    (the daemon's, where logs written before submissions had their own
    subjects keep them). Tokens never contain dots, so the kind is found from
    the right and the prefix need not be known.
    """
    tokens = subject.split(b".")
    kind = _KIND.get(type(event), b"other")
    on_submit = len(tokens) >= 4 and tokens[-3] == b"submit"
    if on_submit and isinstance(event, JobSubmitted):
        if tokens[-2] == subject_token(event.queue).encode() and tokens[-1] == subject_token(event.job).encode():
            return None
        return (
            f"submission of job {event.job!r} to queue {event.queue!r} published on "
            f"{subject.decode(errors='replace')!r}: a submission counts only on its own queue's and job's subject"
        )
    if not on_submit and len(tokens) >= 3 and (tokens[-2] == kind or (kind == b"submit" and tokens[-2] == b"job")):
        return None
    return (
        f"{type(event).__name__} published on {subject.decode(errors='replace')!r}, "
        f"not on a {kind.decode()}.* subject where it belongs"
    )


class SubjectRule:
    """`subject_problem` for a reader's hot loop: a subject's slot found good once is not split again.

    Except for a submission (whose rule reads its last two tokens), whether
    an event may be taken from a subject depends only on the event's type
    and the subject without its last token (the slot, `<prefix>.<kind>`): a
    good (slot, type) pair is remembered, anything else goes to
    `subject_problem`, which also words the problem. A stream has a handful
    of good slots, so the memory stays small.
    """

    __slots__ = ("_good",)

    def __init__(self) -> None:
        self._good: set[tuple[bytes, type]] = set()

    def problem(self, subject: bytes, event: Event) -> str | None:
        cls = type(event)
        if cls is JobSubmitted:
            return subject_problem(subject, event)
        key = (subject.rpartition(b".")[0], cls)
        if key in self._good:
            return None
        problem = subject_problem(subject, event)
        if problem is None:
            self._good.add(key)
        return problem
