"""What the gangs wait to learn from the API server, each asked once: owners' sizes, Jobs' completions,
namespaces' default queues.

Pure bookkeeping, no I/O: `gangs.Gangs` asks here when a gang cannot go on without a read (an owner
whose size neither its pods nor the log give, a Job whose completions say which of a run's slots are
done, a gang naming no queue whose namespace may name one); the adapter drains what to read
(`owners`, `namespaces`: `lookups.Lookups` reads them) and hands the answers back to `Gangs`
(`set_size`, `set_namespace_queue`), which keeps a namespace's here.

Invariants:
- Each gang asks for its owner once (`Gang.asked`: its size, or a Job's completions), and again only
  when a pod beyond its size says its owner may run more pods at once now (`recount`, once a run):
  a relist of a cluster holding thousands of gangs must not fire thousands of reads (they starved a
  new leader's event loop).
- Each namespace is asked for once; its answer ("" for none, or when it cannot be read) is kept.
"""

from __future__ import annotations

from muster.daemon.k8s.gangruns import Gang
from muster.daemon.k8s.pods import Owner

__all__ = ["Asks"]


class Asks:
    """The reads the gangs wait for, and the namespaces' default queues once read."""

    def __init__(self, *, namespace_queues: bool) -> None:
        """`namespace_queues`: a gang naming no queue takes its namespace's default (`muster.dev/default-queue`)."""
        self._owners: list[Owner] = []
        self._namespace_queues = namespace_queues
        self._ns_queue: dict[str, str] = {}
        """Namespace -> its default queue ("" for none), once read."""
        self._ns_wanted: list[str] = []
        self._ns_asked: set[str] = set()

    # ------------------------------------------------------------ owners

    def owner(self, gang: Gang) -> None:
        """Read the gang's owner (its size, a Job's completions), unless the gang asked already."""
        if not gang.asked:
            gang.asked = True
            self._owners.append(gang.owner)

    def recount(self, owner: Owner) -> None:
        """Read the owner again: a pod beyond its gang's size came (`resizing.wants_recount` said so, once a run)."""
        self._owners.append(owner)

    def owners(self) -> list[Owner]:
        """Owners to read, not asked for yet (each is returned once)."""
        out, self._owners = self._owners, []
        return out

    # ------------------------------------------------------------ namespaces

    def default_unread(self, namespace: str) -> bool:
        """Whether gangs take their namespace's default queue and `namespace`'s is not read yet."""
        return self._namespace_queues and namespace not in self._ns_queue

    def namespace(self, namespace: str) -> None:
        """Read the namespace's default queue: a gang there names no queue of its own (asked once)."""
        if namespace not in self._ns_asked:
            self._ns_asked.add(namespace)
            self._ns_wanted.append(namespace)

    def namespace_queue(self, namespace: str) -> str:
        """The namespace's default queue as read ("" for none, or not read)."""
        return self._ns_queue.get(namespace, "")

    def set_namespace_queue(self, namespace: str, queue: str) -> None:
        self._ns_queue[namespace] = queue

    def namespaces(self) -> list[str]:
        """Namespaces whose default queue a waiting gang needs, not asked for yet (each is returned once)."""
        out, self._ns_wanted = self._ns_wanted, []
        return out
