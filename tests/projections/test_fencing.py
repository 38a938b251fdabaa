"""The one fencing rule (`projections.fencing`) as a table."""

from __future__ import annotations

import pytest

from muster.projections.fencing import fenced, newer_leader


@pytest.mark.parametrize(
    ("decision", "leader", "answer"),
    [
        pytest.param(1, 2, True, id="older-epoch-fenced"),
        pytest.param(2, 2, False, id="current-epoch-takes-effect"),
        pytest.param(3, 2, False, id="newer-epoch-kept-before-its-election"),
        pytest.param(0, 0, False, id="no-leader-yet"),
    ],
)
def test_fenced(decision: int, leader: int, answer: bool) -> None:
    """A decision is fenced exactly when its epoch is older than the last election folded."""
    assert fenced(decision, leader) is answer


@pytest.mark.parametrize(
    ("elected", "leader", "answer"),
    [
        pytest.param(3, 2, True, id="newer-takes-over"),
        pytest.param(2, 2, False, id="same-epoch-again-ignored"),
        pytest.param(1, 2, False, id="older-ignored"),
    ],
)
def test_newer_leader(elected: int, leader: int, answer: bool) -> None:
    """An election takes effect exactly when its epoch is newer than the last one folded."""
    assert newer_leader(elected, leader) is answer
