"""Leader election through a NATS KV bucket: one key, created with a TTL, refreshed by revision.

A candidate holds the lease from the moment `create(key)` succeeds (the key
did not exist) and keeps it by `update(key, last=revision)` every `ttl / 5`
seconds. A leader that stops refreshing (crashed, paused, cut off) loses
it a TTL after its last write: the bucket's TTL (max age) removes the key,
and a standby that has seen the same revision for a TTL by its own clock
takes it over at once, with `update(key, last=that revision)`, instead of
waiting for the server's expiry and its next poll. `resign()` deletes the
key (by revision) so a standby takes over at once.

Invariants:
- `leading()` is a local, conservative judgement: True only until
  `ttl * VALIDITY` seconds (monotonic clock) after the send of the last
  successful create/update. The server expires the key `ttl` after it stored
  that write, so a leader that was paused or cut off stops believing it leads
  before anyone else can win the key.
- An update that finds another revision means the lease is lost: the elector
  never overwrites a key it does not hold, but one whose holder has not
  written it for a TTL since this elector first saw it (a later write, or
  the server's expiry, makes that update fail). Clocks of different
  processes are never compared. A resign never deletes a key someone else
  holds.
- The lease alone is not authority over the log: the loop appends a fenced
  `LeaderElected` with a new epoch and only decides once it is folded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from muster.events.leases import LEADER_KEY, LEADER_NAME, lease_record

__all__ = ["VALIDITY", "Elector", "HeldLease", "KvElector", "SoleElector"]

log = structlog.get_logger("muster.leader")

VALIDITY = 0.75
"""Fraction of the TTL after the last confirmed refresh during which the holder trusts its lease."""


class Elector(Protocol):
    """Who may lead (`leader.KvElector`, or `SoleElector` for a single replica)."""

    holder: str
    on_change: Callable[[], None] | None

    def leading(self) -> bool: ...

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...

    async def resign(self) -> None: ...


class SoleElector:
    """The only replica: always holds the lease (tests and `--no-leader-election`)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.on_change: Callable[[], None] | None = None
        self._resigned = False

    def leading(self) -> bool:
        return not self._resigned

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep_forever()

    async def resign(self) -> None:
        self._resigned = True


class HeldLease:
    """What every lease-backed elector shares: the holder's local judgement of its lease, and its timing.

    A subclass says whether it holds the lease (`holds`), calls `_won(sent)` or
    `_renewed(sent)` with the monotonic time it *sent* the write that
    succeeded, and `_lose()` when the lease is gone.
    """

    def __init__(self, holder: str, ttl: float, on_change: Callable[[], None] | None) -> None:
        self.holder = holder
        self.ttl = ttl
        self.on_change = on_change
        self.valid_until = 0.0
        self.terms = 0
        """Times this elector won the lease."""
        self._seen: str | None = None
        self.lapses_at: float | None = None
        """When (monotonic) the lease as last seen lapses, unless its holder writes it again meanwhile."""

    def holds(self) -> bool:
        raise NotImplementedError

    def leading(self) -> bool:
        return self.holds() and anyio.current_time() < self.valid_until

    @property
    def refresh_every(self) -> float:
        # several refreshes per validity window, so one slow round trip does not lapse the lease
        return self.ttl / 5

    @property
    def poll_every(self) -> float:
        """How often a standby tries to take the lease: a takeover waits out the TTL, then up to this."""
        return min(1.0, self.ttl / 4)

    def _observe(self, version: str, duration: float) -> None:
        """The lease was read at `version`: it lapses `duration` after this elector first saw that version.

        First seen by our own clock, which runs after the holder's write: the holder stopped
        believing in it (`VALIDITY` of the TTL after sending that write) before it lapses here.
        """
        if version != self._seen:
            self._seen = version
            self.lapses_at = anyio.current_time() + duration

    def lapsed(self) -> bool:
        """Whether the lease as last seen has not changed for its duration (another may take it)."""
        return self.lapses_at is not None and anyio.current_time() >= self.lapses_at

    def campaign_delay(self) -> float:
        """How long a standby waits before its next try: the poll interval, or less when the lease lapses sooner.

        A lapse already past (a try that failed, a resigned elector standing aside) waits a whole poll: no spin.
        """
        left = self.lapses_at - anyio.current_time() if self.lapses_at is not None else 0.0
        return min(self.poll_every, left) if left > 0 else self.poll_every

    def _won(self, sent: float) -> None:
        self.valid_until = sent + self.ttl * VALIDITY
        self.terms += 1
        self._changed()

    def _renewed(self, sent: float) -> None:
        self.valid_until = sent + self.ttl * VALIDITY

    def _drop(self) -> None:
        """Forget the lease held (the subclass's record of it)."""
        raise NotImplementedError

    def _lose(self) -> None:
        self._drop()
        self.valid_until = 0.0
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


class KvElector(HeldLease):
    def __init__(
        self,
        js: object,
        *,
        holder: str,
        bucket: str = LEADER_NAME,
        key: str = LEADER_KEY,
        ttl: float = 10.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(holder, ttl, on_change)
        self.js = js
        self.bucket = bucket
        self.key = key
        self.revision: int | None = None
        self.kv: KeyValue | None = None

    def holds(self) -> bool:
        return self.revision is not None

    @property
    def poll_every(self) -> float:
        # a KV read is one cheap round trip: look often, so the lapse is seen soon after the holder's last write
        return min(0.1, self.ttl / 20)

    def _drop(self) -> None:
        self.revision = None

    # ------------------------------------------------------------ running

    async def open(self) -> KeyValue:
        """Create the bucket, or use the existing one (whose TTL then governs)."""
        js = self.js
        try:
            kv: KeyValue = await js.create_key_value(  # type: ignore[attr-defined]
                KeyValueConfig(bucket=self.bucket, ttl=self.ttl, history=1)
            )
        except BadRequestError:
            kv = await js.key_value(self.bucket)  # type: ignore[attr-defined]
            status = await kv.status()
            if status.ttl and abs(status.ttl - self.ttl) > 1e-3:
                log.warning("leader bucket exists with another TTL; using it", bucket=self.bucket, ttl=status.ttl)
                self.ttl = float(status.ttl)
        self.kv = kv
        return kv

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Campaign, then hold the lease, forever (until cancelled)."""
        kv = self.kv or await self.open()
        task_status.started()
        while True:
            if self.revision is None:
                await self._campaign(kv)
                if self.revision is None:
                    await anyio.sleep(self.campaign_delay())
            else:
                await anyio.sleep(max(0.0, min(self.refresh_every, self.valid_until - anyio.current_time() - 0.05)))
                await self._refresh(kv)

    async def _campaign(self, kv: KeyValue) -> None:
        sent = anyio.current_time()
        try:
            try:
                entry = await kv.get(self.key)
            except KeyNotFoundError:  # nobody holds it (never held, resigned, or expired by the server)
                revision = await kv.create(self.key, lease_record(self.holder))
            else:
                held = int(entry.revision or 0)
                self._observe(str(held), self.ttl)
                if not self.lapsed():
                    return  # someone holds it and has written it within a TTL, as far as we have seen
                # its holder stopped a TTL ago by our clock; a write of its since then makes this fail
                revision = await kv.update(self.key, lease_record(self.holder), last=held)
        except KeyWrongLastSequenceError:
            return  # someone holds it
        except Exception as exc:  # NATS trouble: try again on the next poll
            log.info("leader campaign failed", error=f"{type(exc).__name__}: {exc}")
            return
        self.revision = int(revision)
        log.info("leader lease won", holder=self.holder, revision=self.revision)
        self._won(sent)

    async def _refresh(self, kv: KeyValue) -> None:
        if self.revision is None:
            return  # resigned while we slept
        sent = anyio.current_time()
        try:
            revision = await kv.update(self.key, lease_record(self.holder), last=self.revision)
        except KeyWrongLastSequenceError:
            if self.revision is not None:
                log.warning("leader lease lost", holder=self.holder)
                self._lose()
            return
        except Exception as exc:
            if anyio.current_time() >= self.valid_until:
                log.warning("leader lease expired while NATS did not answer", error=f"{type(exc).__name__}: {exc}")
                self._lose()
            return
        if self.revision is None:
            return  # resigned while the update was in flight; resign deletes by revision, so nothing to undo
        if sent >= self.valid_until:
            # we were frozen past our own validity: someone may have won meanwhile, and
            # the revision check passing only means nobody has yet; give the term up cleanly
            log.warning("leader lease refreshed after it lapsed locally; resigning", holder=self.holder)
            self.revision = int(revision)
            await self.resign()
            return
        self.revision = int(revision)
        self._renewed(sent)

    async def resign(self) -> None:
        """Give the lease up (delete the key if it is still ours)."""
        revision, kv = self.revision, self.kv
        self._lose()
        if revision is None or kv is None:
            return
        with anyio.move_on_after(2, shield=True):
            try:
                await kv.delete(self.key, last=revision)
                log.info("leader lease released", holder=self.holder)
            except Exception as exc:  # not ours any more, or NATS is gone: the TTL does it
                log.info("leader lease not released", error=f"{type(exc).__name__}: {exc}")
