"""How the log's readers use Python's cyclic garbage collector.

Decoding and folding a log, decoding a snapshot, building the rows of a view:
each makes millions of small objects that live on, and the collector, run every
few hundred allocations, walks them again and again for cycles they do not form
(memory is still freed by reference counting). `no_gc` pauses it for such a
stretch: decodes are 5-10x faster. The daemon's own tuning of the collector is
`daemon/heap.py`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["no_gc"]


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
