"""Job names people can type: the full id, the short name, or any unique prefix of either.

A job from a cluster has the id `namespace/kind/name-uid8` (`daemon.k8s.gangs.Owner.job_id`);
its short name is the owner's `name` (`team-a-g0024`), which is what a user knows. Every
command that takes a job resolves what was typed here, in this order:

1. the full id;
2. the short name, or the id's last segment (`name-uid8`);
3. a prefix of the id, of its last segment or of the short name.

A step that finds exactly one job decides. One that finds several is ambiguous unless
exactly one of them is `preferred` (a command that acts on live jobs prefers those); then
that one is chosen. Nothing found lists the closest ids. The caller says which job it chose
(`Resolved.note`) whenever it was not typed in full.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

_UID_SUFFIX = re.compile(r"-[0-9a-z]{8}$")
SHOWN = 10
"""Candidates listed at most."""


def short_name(job_id: str) -> str:
    """`team-a-g0024` for `team-a/job/team-a-g0024-1a2b3c4d`; any other id is its own short name."""
    parts = job_id.split("/")
    if len(parts) == 3 and all(parts):
        return _UID_SUFFIX.sub("", parts[2]) or parts[2]
    return job_id


def _names(job_id: str) -> tuple[str, ...]:
    """What a user may type in full for a job: its short name and the last segment of its id."""
    last = job_id.rsplit("/", 1)[-1]
    short = short_name(job_id)
    return (short,) if short == last else (short, last)


class NameProblem(Exception):
    """No job, or several, answer to what was typed; the message lists candidates (exit 2)."""


@dataclass(frozen=True)
class Resolved:
    job: str
    typed: str
    how: str
    """`id`, `short name` or `prefix`."""

    @property
    def note(self) -> str | None:
        """What to tell the user when the job was not named by its full id."""
        if self.how == "id":
            return None
        return f"{self.typed!r} is job {self.job} (by {self.how})"


def resolve(typed: str, ids: Iterable[str], preferred: Callable[[str], bool] | None = None) -> Resolved:
    """The job `typed` names among `ids` (see the module docstring); raises NameProblem."""
    all_ids = sorted(set(ids))
    if typed in all_ids:
        return Resolved(typed, typed, "id")
    by_name = [j for j in all_ids if typed in _names(j)]
    if by_name:
        return Resolved(_one(typed, by_name, preferred, "short name"), typed, "short name")
    by_prefix = [j for j in all_ids if j.startswith(typed) or any(n.startswith(typed) for n in _names(j))]
    if by_prefix:
        return Resolved(_one(typed, by_prefix, preferred, "prefix"), typed, "prefix")
    close = difflib.get_close_matches(typed, all_ids, n=SHOWN, cutoff=0.6)
    close += [j for j in difflib.get_close_matches(typed, [short_name(j) for j in all_ids], n=SHOWN) if j not in close]
    hint = f"; closest: {', '.join(close[:SHOWN])}" if close else ""
    raise NameProblem(f"no job {typed!r} (by id, short name or prefix){hint}")


def _one(typed: str, candidates: list[str], preferred: Callable[[str], bool] | None, how: str) -> str:
    if len(candidates) == 1:
        return candidates[0]
    if preferred is not None:
        live = [j for j in candidates if preferred(j)]
        if len(live) == 1:
            return live[0]
    shown = ", ".join(candidates[:SHOWN]) + (f" and {len(candidates) - SHOWN} more" if len(candidates) > SHOWN else "")
    raise NameProblem(f"{typed!r} is ambiguous: {len(candidates)} jobs match by {how}: {shown}")


def display_names(shown: Iterable[str], ids: Collection[str]) -> dict[str, str]:
    """For each id of `shown`, the shortest name that names only it among `ids` (every job): its short
    name when no other job has it (nor has it as its id), else the id itself."""
    counts: dict[str, int] = {}
    for j in ids:
        if "/" in j:  # only a cluster's ids have a short name other than themselves
            short = short_name(j)
            counts[short] = counts.get(short, 0) + 1
    out = {}
    for j in shown:
        short = short_name(j)
        unique = short == j or (counts.get(short, 0) == 1 and short not in ids)
        out[j] = short if unique else j
    return out
