"""muster.events: the event model (schemas, codec, upcasters) and the JetStream store.

This layer imports nothing from the rest of muster. Everything stored is a JSON
object with a `type` tag, an event time `at` (integer seconds) and a schema
version `v`.
"""

from muster.events.codec import DecodeError, decode, decode_many, encode
from muster.events.types import *  # noqa: F403
from muster.events.types import __all__ as _types_all

__all__ = ["DecodeError", "decode", "decode_many", "encode", *_types_all]
