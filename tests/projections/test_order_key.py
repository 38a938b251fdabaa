"""The one admission order (`index.order_key`)."""

from __future__ import annotations

from muster.projections.index import order_key


def test_order_key_ranks_quota_position_then_share_then_priority_then_submission() -> None:
    """Within nominal beats borrowing, a smaller share a larger, higher priority lower, earlier later."""
    keys = {
        "borrowing-high": order_key(1000, 1, over_nominal=1),
        "within-big-share": order_key(0, 2, share=5),
        "within-low-early": order_key(0, 3),
        "within-low-late": order_key(0, 9),
        "within-high-late": order_key(100, 10),
    }
    assert sorted(keys, key=keys.__getitem__) == [
        "within-high-late",
        "within-low-early",
        "within-low-late",
        "within-big-share",
        "borrowing-high",
    ]
