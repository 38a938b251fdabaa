"""The decoder on hostile bytes: anything that is not an event is a DecodeError, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.events.codec import DecodeError, decode


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deep-array"),
        pytest.param(b'{"type":"JobSubmitted","at":' + b"[" * 50_000 + b"]" * 50_000 + b"}", id="deep-field"),
        pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="deep-object"),
    ],
)
def test_deeply_nested_json_is_a_decode_error(raw: bytes) -> None:
    """JSON nested past the interpreter's recursion limit is reported as bad input, not a RecursionError."""
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode(raw)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_arbitrary_bytes_decode_or_raise_decode_error(raw: bytes) -> None:
    """Random bytes and random JSON either decode to an event or raise DecodeError with a message."""
    try:
        decode(raw)
    except DecodeError as exc:
        assert exc.message
