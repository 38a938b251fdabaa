"""Where the daemon's leader lease is kept and what it records: one name and one format for every reader.

The daemon's electors (`daemon.leader.KvElector`, `daemon.k8s.lease.LeaseElector`)
write the lease, and the snapshot sidecar's gate (`replay.snapshotwriter.KvLeaderGate`)
reads it; they live in layers that do not import each other, so the name and
the record are defined here, below both. The KV bucket and the Kubernetes
Lease share one default name; the lease records the holder's identity (the
KV value as UTF-8, the Lease's `spec.holderIdentity`), nothing else.
"""

from __future__ import annotations

__all__ = ["LEADER_KEY", "LEADER_NAME", "holder_of", "lease_record"]

LEADER_NAME = "muster-leader"
"""The KV bucket of the `nats-kv` backend and the Lease of the `lease` backend (the chart names its own)."""
LEADER_KEY = "leader"
"""The key in `LEADER_NAME` that holds the lease."""


def lease_record(holder: str) -> bytes:
    """What a KV lease holds while `holder` has it."""
    return holder.encode()


def holder_of(record: bytes | None) -> str | None:
    """Who a KV lease record names (None: nobody)."""
    return bytes(record or b"").decode(errors="replace") or None
