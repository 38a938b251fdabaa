"""Where snapshots live: a NATS object store bucket, a directory, or memory, behind `SnapshotBackend`.

Snapshots are keyed by stream sequence (`snapshot_name`) and kept apart from
the event stream (which only the sealer purges). A backend stores bytes and
metadata as given and checks nothing but its own integrity: `get` raises
`SnapshotError` on bytes it cannot read back intact. Whether a snapshot may be
trusted is decided on load (`snapshots`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol

import msgspec

from muster.replay.snapshotcodec import SnapshotError, SnapshotMeta


class SnapshotBackend(Protocol):
    """Where snapshots live. `get` raises SnapshotError on bytes that fail the store's own checks."""

    async def put(self, meta: SnapshotMeta, data: bytes) -> None: ...

    async def list(self) -> list[SnapshotMeta]: ...

    async def get(self, name: str) -> bytes: ...

    async def set_meta(self, meta: SnapshotMeta) -> None: ...

    async def delete(self, name: str) -> None: ...


class MemorySnapshots:
    """Snapshots in a dict (tests, benchmarks, one-off analyses)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[SnapshotMeta, bytes]] = {}

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        self.items[meta.name] = (meta, data)

    async def list(self) -> list[SnapshotMeta]:
        return [m for m, _ in self.items.values()]

    async def get(self, name: str) -> bytes:
        try:
            return self.items[name][1]
        except KeyError:
            raise SnapshotError(f"{name}: no such snapshot") from None

    async def set_meta(self, meta: SnapshotMeta) -> None:
        if meta.name in self.items:
            self.items[meta.name] = (meta, self.items[meta.name][1])

    async def delete(self, name: str) -> None:
        self.items.pop(name, None)


class DirSnapshots:
    """Snapshots as files `NAME.snap` + `NAME.json` in a directory (for file logs); writes are atomic renames."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _write(self, target: Path, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        self._write(self.path / f"{meta.name}.snap", data)
        self._write(self.path / f"{meta.name}.json", msgspec.json.encode(meta))

    async def list(self) -> list[SnapshotMeta]:
        out: list[SnapshotMeta] = []
        if not self.path.is_dir():
            return out
        for p in sorted(self.path.glob("seq-*.json")):
            try:
                out.append(msgspec.json.decode(p.read_bytes(), type=SnapshotMeta))
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue  # not ours, or half-written by a crashed writer: never trusted
        return out

    async def get(self, name: str) -> bytes:
        try:
            return (self.path / f"{name}.snap").read_bytes()
        except OSError as exc:
            raise SnapshotError(f"{name}: {exc.strerror or exc}") from None

    async def set_meta(self, meta: SnapshotMeta) -> None:
        self._write(self.path / f"{meta.name}.json", msgspec.json.encode(meta))

    async def delete(self, name: str) -> None:
        for suffix in (".snap", ".json"):
            (self.path / f"{name}{suffix}").unlink(missing_ok=True)


class NatsSnapshots:
    """Snapshots in a JetStream object store bucket; the metadata is the object's description (JSON)."""

    def __init__(self, obs: Any, bucket: str) -> None:
        self.obs = obs
        self.bucket = bucket

    @classmethod
    async def open(cls, js: Any, bucket: str, *, create: bool) -> NatsSnapshots | None:
        """The bucket, created when `create` (file storage); None when it does not exist and may not be made."""
        from nats.js.api import ObjectStoreConfig, StorageType
        from nats.js.errors import BucketNotFoundError, NotFoundError

        try:
            return cls(await js.object_store(bucket), bucket)
        except (BucketNotFoundError, NotFoundError):
            if not create:
                return None
        obs = await js.create_object_store(
            bucket, ObjectStoreConfig(description="muster cluster state snapshots", storage=StorageType.FILE)
        )
        return cls(obs, bucket)

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        from nats.js.api import ObjectMeta

        await self.obs.put(meta.name, data, meta=ObjectMeta(name=meta.name, description=_meta_text(meta)))

    async def list(self) -> list[SnapshotMeta]:
        from nats.js.errors import NotFoundError

        try:
            infos = await self.obs.list(ignore_deletes=True)
        except NotFoundError:
            return []
        out: list[SnapshotMeta] = []
        for info in infos:
            if info.deleted or not info.description:
                continue
            try:
                out.append(msgspec.json.decode(info.description.encode(), type=SnapshotMeta))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        return out

    async def get(self, name: str) -> bytes:
        import io

        from nats.js.errors import Error as NatsJsError

        buf = io.BytesIO()
        try:
            # writeinto: nats-py otherwise grows the result with bytes += chunk (quadratic)
            result = await self.obs.get(name, writeinto=buf)
        except NatsJsError as exc:
            raise SnapshotError(f"{name}: {type(exc).__name__} {exc}") from None
        return buf.getvalue() or bytes(result.data or b"")

    async def set_meta(self, meta: SnapshotMeta) -> None:
        from nats.js.api import ObjectMeta

        await self.obs.update_meta(meta.name, ObjectMeta(name=meta.name, description=_meta_text(meta)))

    async def delete(self, name: str) -> None:
        from nats.js.errors import Error as NatsJsError

        with contextlib.suppress(NatsJsError):
            await self.obs.delete(name)


def _meta_text(meta: SnapshotMeta) -> str:
    return msgspec.json.encode(meta).decode()


def default_bucket(stream: str) -> str:
    return f"{stream}-snapshots"
