"""Subjects of the log: where each event is published, and which subjects an event counts on.

Role: `<prefix>.<kind>.<id>` for every event, `<prefix>.<kind>.<queue>.<id>` for
a job's events where its queue is known (`subject_for`), tokens made safe for
NATS (`subject_token`), and the rule readers apply to every message
(`subject_problem`): an event counts only on its own subjects, so NATS
permissions on subjects are permissions on what the events say (who may write)
and on which events an identity may read (a team: its own queue's).
"""

from __future__ import annotations

import hashlib
import re

from muster.events.types import (
    CohortConfigured,
    CycleSettled,
    Event,
    FlavorConfigured,
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

__all__ = [
    "CLUSTER_KINDS",
    "DEFAULT_PREFIX",
    "SCOPED_KINDS",
    "SubjectRule",
    "queue_filters",
    "subject_for",
    "subject_problem",
    "subject_token",
]

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


# the events about one job: published on `job.<id>` (or `job.<queue>.<id>`), by the daemon's identity only
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
# a user's job control (`muster cancel|hold|release`) names the job's queue and goes on
# `control.<queue>.<id>`, which that queue's own identity may publish to
_CONTROL_EVENTS = (JobCancelled, JobHeld, JobReleased)

SCOPED_KINDS = frozenset({"submit", "control", "job"})
"""Kinds whose subjects may carry a queue (`<kind>.<queue>.<id>`); a prefix may not end in one."""


def _route(event: Event, queue: str | None) -> tuple[str, str]:
    """(kind, id) of an event's subject; a queue-scoped id is `<queue>.<job>`."""
    if isinstance(event, _CONTROL_EVENTS) and event.queue is not None:
        return "control", f"{subject_token(event.queue)}.{subject_token(event.job)}"
    if isinstance(event, _JOB_EVENTS):
        own = getattr(event, "queue", None)  # an admission's, or the refused submission's
        scope = own if own is not None else queue
        if scope is not None:
            return "job", f"{subject_token(scope)}.{subject_token(event.job)}"
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
        case FlavorConfigured():
            return "flavor", subject_token(event.name)
        case SchedulerConfigured():
            return "scheduler", "config"
        case LeaderElected():
            return "leader", subject_token(event.holder)
        case CycleSettled():
            return "cycle", str(event.epoch)
    return "other", subject_token(type(event).__name__)


def subject_for(event: Event, prefix: str = DEFAULT_PREFIX, queue: str | None = None) -> str:
    """`<prefix>.<kind>.<id>` for an event; `<prefix>.<kind>.<queue>.<job>` where a queue is known.

    A submission and a user's control event name their queue themselves
    (`submit.<queue>.<job>`, `control.<queue>.<job>`), and so do an admission
    and a refused submission (`job.<queue>.<job>`); for a job's other events
    the writer passes its `queue` (the daemon: `EventStore.queue_of`), so a
    team's identity can be allowed to read its own jobs' events and no others
    (`queue_filters`). Without it they go to `job.<job>`, as every job event
    did before.
    """
    kind, ident = _route(event, queue)
    return f"{prefix}.{kind}.{ident}"


_KIND: dict[type, bytes] = {
    JobSubmitted: b"submit",
    **{t: b"job" for t in _JOB_EVENTS},
    **{t: b"node" for t in (NodeAdded, NodeUpdated, NodeRemoved, NodeCordoned)},
    QueueConfigured: b"queue",
    CohortConfigured: b"cohort",
    PriorityClassConfigured: b"priorityclass",
    FlavorConfigured: b"flavor",
    SchedulerConfigured: b"scheduler",
    LeaderElected: b"leader",
    CycleSettled: b"cycle",
}


CLUSTER_KINDS = ("queue", "cohort", "priorityclass", "scheduler", "node", "leader")
"""Kinds every reader needs to fold a queue's jobs: configuration, nodes, leadership (fencing)."""


def queue_filters(queue: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The subjects a queue's own identity reads: its jobs' (`<kind>.<queue>.*`) and the cluster-wide kinds.

    One filter per kind, because NATS can permit a consumer by the one filter
    named in its create subject (deploy/nats/accounts.conf grants exactly
    these). Job events written without their queue (`job.<job>`: logs
    from before, a fact the daemon wrote before folding its job) are not among
    them.
    """
    return [f"{prefix}.*.{subject_token(queue)}.*", *(f"{prefix}.{kind}.*" for kind in CLUSTER_KINDS)]


_SCOPED = frozenset(kind.encode() for kind in SCOPED_KINDS)


def _scoped_kind(tokens: list[bytes]) -> bytes | None:
    """`submit`, `control` or `job` for a `<kind>.<queue>.<id>` subject, else None."""
    if len(tokens) >= 4 and tokens[-3] in _SCOPED:
        return tokens[-3]
    return None


def subject_problem(subject: bytes, event: Event) -> str | None:
    """Why `event` must not be taken from `subject` (None when it may), whatever the prefix.

    Each kind of event has its own subjects, and NATS permissions say who may
    publish where (deploy/nats/accounts.conf): only the daemon publishes on
    `job.>`, a team only on `submit.<its queue>.*` and `control.<its queue>.*`.
    So a submission counts only on the `submit.<queue>.<job>` subject of its
    own queue and job (or on `job.<id>`, the daemon's, where logs written
    before submissions had their own subjects keep them); a user's control
    event (one naming its queue) only on `control.<queue>.<job>` of that queue
    and job; every other event only on a subject of its kind (`job.<id>` or
    `job.<queue>.<id>` for a job's). Tokens never contain dots, so the kind is
    found from the right and the prefix need not be known.
    """
    tokens = subject.split(b".")
    scoped = _scoped_kind(tokens)
    if isinstance(event, JobSubmitted):
        if scoped == b"submit" and _names(tokens, event.queue, event.job):
            return None
        if scoped is None and len(tokens) >= 3 and tokens[-2] == b"job":
            return None
        return (
            f"submission of job {event.job!r} to queue {event.queue!r} published on "
            f"{subject.decode(errors='replace')!r}: a submission counts only on its own queue's and job's subject"
        )
    if isinstance(event, _CONTROL_EVENTS) and event.queue is not None:
        if scoped == b"control" and _names(tokens, event.queue, event.job):
            return None
        return (
            f"{type(event).__name__} of job {event.job!r} for queue {event.queue!r} published on "
            f"{subject.decode(errors='replace')!r}: a user's job control counts only on its own queue's "
            "and job's control subject"
        )
    kind = _KIND.get(type(event), b"other")
    if scoped == b"job" == kind or (scoped is None and len(tokens) >= 3 and tokens[-2] == kind):
        return None
    return (
        f"{type(event).__name__} published on {subject.decode(errors='replace')!r}, "
        f"not on a {kind.decode()}.* subject where it belongs"
    )


def _names(tokens: list[bytes], queue: str, job: str) -> bool:
    """Whether `<kind>.<queue>.<job>` subject tokens name this queue and job."""
    return tokens[-2] == subject_token(queue).encode() and tokens[-1] == subject_token(job).encode()


_QUEUE_NAMING = frozenset({JobSubmitted, *_CONTROL_EVENTS})
"""Types whose subjects may name their queue and job (a submission, a user's control)."""


class SubjectRule:
    """`subject_problem` for a reader's hot loop: a subject's slot found good once is not split again.

    Except for a submission or a user's control event (whose rule reads its
    last two tokens), whether an event may be taken from a subject depends
    only on the event's type and the subject without its last token (the
    slot, `<prefix>.<kind>` or `<prefix>.job.<queue>`): a good (slot, type)
    pair is remembered, anything else goes to `subject_problem`, which also
    words the problem. A stream has a handful of good slots per queue, so the
    memory stays small.
    """

    __slots__ = ("_good",)

    def __init__(self) -> None:
        self._good: set[tuple[bytes, type]] = set()

    def problem(self, subject: bytes, event: Event) -> str | None:
        cls = type(event)
        if cls in _QUEUE_NAMING:
            # the rule may read the subject's last two tokens: not a matter of the slot alone
            return subject_problem(subject, event)
        key = (subject.rpartition(b".")[0], cls)
        if key in self._good:
            return None
        problem = subject_problem(subject, event)
        if problem is None:
            self._good.add(key)
        return problem
