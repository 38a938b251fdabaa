"""How the daemon's process uses Python's cyclic garbage collector.

The daemon allocates in bursts: a watch event of one pod is a few hundred
dicts and lists, a binding an aiohttp request and its futures. With the
interpreter's default thresholds (a young pass every 700 net allocations, an
old pass every 10 young ones, a full pass whenever the long-lived heap grew
by a quarter) the collector ran ~1,000 young and ~10 full passes while the
daemon bound 2,000 pods against a real API server, and the full passes walk
every object the daemon holds (the folded log, the cluster's pods): 1.2-1.6 s
of the ~4.4 s of CPU the daemon spent on those 2,000 pods (`bench/bench_k8s_real.py`).

Memory is reclaimed by reference counting; the collector only finds cycles,
which the daemon's data rarely forms. So `tune` makes young passes rarer
(`YOUNG` allocations between them: the same work per object, fewer objects
still alive mid-burst promoted into the older generations) and moves what
exists at start-up (modules, configuration) out of the collector's passes
for good (`gc.freeze`).
"""

from __future__ import annotations

import gc

from muster.replay.heap import YOUNG

__all__ = ["YOUNG", "tune"]


def tune() -> None:
    """Set the daemon's collector thresholds and freeze the start-up heap (once per process, before serving)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, older, oldest)
    gc.collect()
    gc.freeze()
