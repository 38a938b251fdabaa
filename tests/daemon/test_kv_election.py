"""Leader election on a NATS KV key (`leader.KvElector`), on the real embedded nats-server.

A standby takes the lease of a holder that stopped writing it as soon as a
TTL has passed since the holder's last write (as the standby saw it), not a
poll interval later, and never while the holder still believes it leads.
TTLs are short, waits are deadlines.
"""

from __future__ import annotations

import uuid

import anyio
from electionkit import running

from muster.daemon.leader import VALIDITY, KvElector
from muster.events.store import EventStore

TTL = 2.0
DEADLINE = 30.0


async def test_a_standby_takes_a_lapsed_lease_at_the_ttl_and_never_while_its_holder_believes(store: EventStore) -> None:
    """A crashed holder's lease is taken a TTL after its last write (within 0.3 s), after its own belief ended."""
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    a = KvElector(store.js, holder="a", bucket=bucket, ttl=TTL)
    b = KvElector(store.js, holder="b", bucket=bucket, ttl=TTL)
    won: list[tuple[float, bool]] = []
    b.on_change = lambda: won.append((anyio.current_time(), a.leading()))
    try:
        async with running(a) as crash:
            with anyio.fail_after(DEADLINE):
                while not a.leading():  # noqa: ASYNC110 - no event for a won lease
                    await anyio.sleep(0.01)
            async with running(b):
                with anyio.fail_after(DEADLINE):
                    while a.revision is None or a.revision < 4:  # noqa: ASYNC110 - a refreshed; b looked meanwhile
                        await anyio.sleep(0.01)
                crash.cancel()  # a stops refreshing, as a killed replica does; its key stays until it lapses
                last_write = a.valid_until - TTL * VALIDITY  # when a sent its last write
                with anyio.fail_after(DEADLINE):
                    while not b.leading():  # noqa: ASYNC110
                        await anyio.sleep(0.005)
    finally:
        await store.js.delete_key_value(bucket)
    (at, a_believed), *_ = won
    assert a_believed is False and a.valid_until <= at  # never two who believe they lead
    assert TTL <= at - last_write <= TTL + 0.3  # at the TTL: not a poll interval, nor the server's expiry, later
    assert b.terms == 1


async def test_a_standby_waits_until_the_lapse_then_polls_again_without_spinning() -> None:
    """Before the lapse it sleeps until it (at most a poll); once past it, a whole poll, never zero (no busy loop)."""
    standby = KvElector(object(), holder="b", ttl=TTL)
    assert standby.campaign_delay() == standby.poll_every  # nothing seen yet
    standby._observe("7", 0.03)  # a revision seen now, lapsing in 30 ms
    assert 0 < standby.campaign_delay() <= 0.03
    await anyio.sleep(0.05)
    assert standby.lapsed() and standby.campaign_delay() == standby.poll_every
