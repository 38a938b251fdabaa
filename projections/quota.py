"""Quota accounting over the cohort tree, with Kueue's semantics.

Every queue and cohort is a node. For each resource:
- a queue's subtree quota is its nominal quota; its guaranteed part is
  `nominal - lending_limit` (when a lending limit is set, else 0): the part it
  never lends;
- a cohort's subtree quota is the sum of its children's lendable quota
  (subtree - guaranteed), and its usage the sum of its children's usage above
  their guaranteed part;
- `available(queue)` walks up the tree: what is left of the queue's guaranteed
  part plus what its parent can give, capped by its borrowing limit.

Consequences (design invariant 4): a queue's usage never exceeds
`nominal + borrowing_limit`, and what it lends never exceeds its lending
limit. A resource a queue does not name has no quota limit.

The tree is derived from `ClusterState`; usage changes made while a cycle
tries admissions and preemptions are undone by `rollback`, or, for the
cycle's own, at the next sync (`settle`), where only the queues the fold did
not change are undone (the others are set from the state). The tree's
usage is a function of the queues' usage alone, so the order does not matter.
"""

from __future__ import annotations

from collections.abc import Mapping

from muster.projections.resources import fmt, undoing
from muster.projections.state import ClusterState, QueueState

UNLIMITED = 1 << 62


class QNode:
    __slots__ = (
        "borrowing_limit",
        "children",
        "guaranteed",
        "is_cohort",
        "name",
        "nominal",
        "parent",
        "subtree",
        "usage",
        "weight",
    )

    def __init__(self, name: str, is_cohort: bool = False) -> None:
        self.name = name
        self.is_cohort = is_cohort
        self.parent: QNode | None = None
        self.children: list[QNode] = []
        self.nominal: dict[str, int] = {}
        self.subtree: dict[str, int] = {}
        self.guaranteed: dict[str, int] = {}
        self.borrowing_limit: dict[str, int] | None = None
        self.usage: dict[str, int] = {}
        self.weight = 1.0


class QuotaTree:
    """Cohorts and queues with their quotas and usage."""

    def __init__(self, state: ClusterState) -> None:
        self.version = 0
        """Bumped by every change of usage: what was computed from usage at one version holds while it stays."""
        self.queues: dict[str, QNode] = {}
        self.cohorts: dict[str, QNode] = {}
        for name in sorted(state.cohorts):
            self.cohorts[name] = QNode(f"cohort:{name}", True)
        for name, parent in sorted(state.cohorts.items()):
            if parent is not None and parent in self.cohorts and not self._would_cycle(name, parent, state):
                node = self.cohorts[name]
                node.parent = self.cohorts[parent]
                node.parent.children.append(node)
        for name in sorted(state.queues):
            q = state.queues[name]
            node = QNode(name)
            node.nominal = dict(q.nominal)
            node.subtree = dict(q.nominal)
            node.borrowing_limit = dict(q.borrowing_limit) if q.borrowing_limit is not None else None
            node.weight = q.weight
            if q.lending_limit is not None:
                node.guaranteed = {
                    r: max(0, v - q.lending_limit[r]) for r, v in q.nominal.items() if r in q.lending_limit
                }
            node.usage = {k: v for k, v in q.usage.items() if v}
            if q.cohort is not None:
                cohort = self.cohorts.get(q.cohort)
                if cohort is None:
                    cohort = self.cohorts[q.cohort] = QNode(f"cohort:{q.cohort}", True)
                node.parent = cohort
                cohort.children.append(node)
            self.queues[name] = node
        for c in self.cohorts.values():
            if c.parent is None:
                self._sum_up(c)
        self.undo: list[tuple[str, dict[str, int], int]] = []

    @staticmethod
    def _would_cycle(name: str, parent: str, state: ClusterState) -> bool:
        seen = {name}
        cur: str | None = parent
        while cur is not None:
            if cur in seen:
                return True
            seen.add(cur)
            cur = state.cohorts.get(cur)
        return False

    def _sum_up(self, cohort: QNode) -> None:
        cohort.subtree = {}
        cohort.usage = {}
        for child in cohort.children:
            if child.is_cohort:
                self._sum_up(child)
            for r, v in child.subtree.items():
                cohort.subtree[r] = cohort.subtree.get(r, 0) + v - child.guaranteed.get(r, 0)
            for r, v in child.usage.items():
                cohort.usage[r] = cohort.usage.get(r, 0) + max(0, v - child.guaranteed.get(r, 0))

    # ------------------------------------------------------------ queries

    def available(self, node: QNode, r: str) -> int:
        parent = node.parent
        usage = node.usage.get(r, 0)
        if parent is None:
            return node.subtree.get(r, 0) - usage
        guaranteed = node.guaranteed.get(r, 0)
        local = max(0, guaranteed - usage)
        parent_avail = self.available(parent, r)
        limits = node.borrowing_limit
        if limits is not None and r in limits:
            stored = node.subtree.get(r, 0) - guaranteed
            used_in_parent = max(0, usage - guaranteed)
            parent_avail = min(stored - used_in_parent + limits[r], parent_avail)
        return local + parent_avail

    def blocking(self, queue: str, req: Mapping[str, int], allow_borrow: bool = True) -> str | None:
        """Why `req` does not fit the queue's quota now (None when it fits).

        The words depend only on the request and the configured limits, never
        on current usage, so a waiting job's reason changes when the situation
        changes in kind, not with every admission elsewhere.
        """
        if self.fits(queue, req, allow_borrow):
            return None
        node = self.queues[queue]
        nominal = node.nominal
        limits = node.borrowing_limit or {}
        asked = {r: req[r] for r in sorted(req) if req[r] > 0 and r in nominal}
        for r, v in asked.items():
            if not allow_borrow or node.parent is None:
                most, what = nominal[r], f"{nominal[r]} nominal"
            elif r in limits:
                most, what = nominal[r] + limits[r], f"{nominal[r]} nominal + {limits[r]} borrowing limit"
            else:
                continue
            if v > most:
                return (
                    f"queue {queue}: {r} {v} requested is more than it may ever use ({what}); "
                    "it waits for a quota change"
                )
        config = f"nominal {fmt({r: nominal[r] for r in asked})}"
        if any(r in limits for r in asked):
            config += f", borrowing limit {fmt({r: limits[r] for r in asked if r in limits})}"
        if not allow_borrow:
            return (
                f"queue {queue} has no room for {fmt(asked)} within its nominal quota ({config}); "
                "a non-preemptible job never borrows"
            )
        if node.parent is None:
            return (
                f"queue {queue} has no room for {fmt(asked)} within its quota ({config}); "
                "it has no cohort to borrow from"
            )
        return f"queue {queue} and its cohort have no room for {fmt(asked)} now ({config})"

    def fits(self, queue: str, req: Mapping[str, int], allow_borrow: bool = True) -> bool:
        node = self.queues[queue]
        nominal = node.nominal
        for r, v in req.items():
            if v <= 0 or r not in nominal:
                continue
            if not allow_borrow and node.usage.get(r, 0) + v > nominal[r]:
                return False
            if v > self.available(node, r):
                return False
        return True

    def within_nominal(self, queue: str, req: Mapping[str, int]) -> bool:
        """Whether the queue stays within its nominal quota with `req` admitted."""
        node = self.queues[queue]
        for r, v in req.items():
            if v > 0 and r in node.nominal and node.usage.get(r, 0) + v > node.nominal[r]:
                return False
        return True

    def over_nominal(self, queue: str, req: Mapping[str, int]) -> dict[str, int]:
        """Per resource, how far the queue would be above its nominal quota with `req` admitted."""
        node = self.queues[queue]
        out: dict[str, int] = {}
        for r, v in req.items():
            if v > 0 and r in node.nominal:
                over = node.usage.get(r, 0) + v - node.nominal[r]
                if over > 0:
                    out[r] = over
        return out

    def borrowed_by(self, queue: str, req: Mapping[str, int]) -> dict[str, int]:
        """The part of `req` above the queue's nominal quota if admitted now."""
        node = self.queues[queue]
        out: dict[str, int] = {}
        for r in sorted(req):
            v = req[r]
            if v <= 0 or r not in node.nominal:
                continue
            usage = node.usage.get(r, 0)
            b = max(0, usage + v - node.nominal[r]) - max(0, usage - node.nominal[r])
            if b > 0:
                out[r] = b
        return out

    def is_borrowing(
        self, queue: str, resources: Mapping[str, int] | None = None, given_back: Mapping[str, int] | None = None
    ) -> bool:
        """Whether the queue uses more than its nominal quota (of the given resources, else any), once it has
        given back `given_back` (a victim search's removals not applied to the tree)."""
        node = self.queues[queue]
        for r, v in node.usage.items():
            if resources is not None and resources.get(r, 0) <= 0:
                continue
            if given_back is not None:
                v -= given_back.get(r, 0)
            if r in node.nominal and v > node.nominal[r]:
                return True
        return False

    def share(self, queue: str, extra: Mapping[str, int] | None = None) -> int:
        """Weighted dominant resource share in per-mille (Kueue's DRS): borrowing over what the cohort lends."""
        node = self.queues[queue]
        parent = node.parent
        if parent is None:
            return 0
        best = 0
        for r, nominal in node.nominal.items():
            usage = node.usage.get(r, 0) + (extra.get(r, 0) if extra else 0)
            above = usage - nominal
            if above <= 0:
                continue
            lendable = parent.subtree.get(r, 0)
            ratio = UNLIMITED if lendable <= 0 else above * 1000 // lendable
            best = max(best, ratio)
        if best == 0:
            return 0
        weight_milli = round(node.weight * 1000)
        if weight_milli <= 0:
            return UNLIMITED
        return min(UNLIMITED, best * 1000 // weight_milli)

    def root_of(self, queue: str) -> str:
        node = self.queues[queue]
        while node.parent is not None:
            node = node.parent
        return node.name

    # ------------------------------------------------------------ changes

    def add(self, queue: str, req: Mapping[str, int], sign: int, record: bool = True) -> None:
        """Add (sign=1) or remove (sign=-1) usage of a queue, updating its ancestors."""
        node: QNode | None = self.queues.get(queue)
        if node is None:
            return
        self.version += 1
        delta = {r: sign * v for r, v in req.items() if v}
        if record:
            self.undo.append((queue, dict(req), sign))
        while node is not None and delta:
            parent = node.parent
            nxt: dict[str, int] = {}
            usage = node.usage
            for r, d in delta.items():
                old = usage.get(r, 0)
                new = old + d
                usage[r] = new
                if parent is not None:
                    g = node.guaranteed.get(r, 0)
                    c = max(0, new - g) - max(0, old - g)
                    if c:
                        nxt[r] = c
            delta = nxt
            node = parent

    def set_usage(self, queue: QueueState) -> tuple[dict[str, int], bool]:
        """Bring a queue's usage in line with the state (outside transactions).

        Returns the change per resource, and whether the queue started
        borrowing (its jobs become reclaimable).
        """
        node = self.queues.get(queue.name)
        if node is None:
            return {}, False
        diff = {r: queue.usage.get(r, 0) - node.usage.get(r, 0) for r in set(queue.usage) | set(node.usage)}
        diff = {r: v for r, v in diff.items() if v}
        if not diff:
            return diff, False
        was_borrowing = self.is_borrowing(queue.name)
        self.add(queue.name, diff, 1, record=False)
        return diff, self.is_borrowing(queue.name) and not was_borrowing

    def headroom(self, queue: str, req: Mapping[str, int], allow_borrow: bool) -> dict[str, int]:
        """Per quota-limited resource of `req`: what is left after it (negative: the shortfall)."""
        node = self.queues[queue]
        out: dict[str, int] = {}
        for r in sorted(req):
            v = req[r]
            if v <= 0 or r not in node.nominal:
                continue
            avail = self.available(node, r)
            if not allow_borrow:
                avail = min(avail, node.nominal[r] - node.usage.get(r, 0))
            out[r] = avail - v
        return out

    def mark(self) -> int:
        return len(self.undo)

    def settle(self, changed: set[str]) -> None:
        """Undo the changes logged since the last sync for the queues not in `changed` (`set_usage` sets those)."""
        if not self.undo:
            return
        changes, self.undo = undoing(self.undo, changed), []
        for queue, delta in changes.items():
            self.add(queue, delta, 1, record=False)

    def rollback(self, to: int = 0) -> None:
        while len(self.undo) > to:
            queue, req, sign = self.undo.pop()
            self.add(queue, req, -sign, record=False)
