"""How the log's readers use Python's cyclic garbage collector.

Decoding and folding a log, decoding a snapshot, building the rows of a view:
each makes millions of small objects that live on, and the collector, run every
few hundred allocations, walks them again and again for cycles they do not form
(memory is still freed by reference counting). `no_gc` pauses it for such a
stretch: decodes are 5-10x faster. A run that folds and decides for long
(`muster sim`, `muster audit`) keeps the collector but makes its young passes
rarer (`fewer_collections`): on bench shape (c), 10,000 nodes and 20,000
gangs, the default thresholds spent a quarter of the run's CPU walking the
cluster's state. The daemon's own tuning of the collector is `daemon/heap.py`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["YOUNG", "fewer_collections", "no_gc"]

YOUNG = 20_000
"""Net allocations of container objects between two young collections (the interpreter's default: 700)."""


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building many small objects (decode, fold): 5-10x faster decodes.

    The fold and decoders make no reference cycles worth collecting early;
    the collector runs again on exit. Hold it around synchronous work only,
    never across an await: the collector is the process's, and every other
    task would run with it off meanwhile (read a batch, then fold it inside).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the young collections every `YOUNG` allocations instead of every 700, for a long fold.

    Unlike `no_gc` the collector still runs, so cycles made during a run of
    minutes are freed; only its passes over the long-lived state are rarer.
    The thresholds are the process's: they are restored on exit.
    """
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG), older, oldest)
    try:
        yield
    finally:
        gc.set_threshold(young, older, oldest)
