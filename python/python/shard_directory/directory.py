"""``ShardDirectory``: the guide's directory client (``lookup``, ``version``), on the Rust core;
``AsyncShardDirectory``, the same for asyncio (nothing it does blocks the event loop)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from typing import Any

from . import _native
from .attempts import Attempts, policy


# An entity's type and id as the directory keys them: the id a str or an int (``8842`` is
# ``"8842"``), neither holding NUL; ``TypeError`` or ``ValueError`` otherwise, before anything is
# asked of the directory. Checked natively, as every native call that takes an entity does.
entity = _native.entity


class _Directory:
    """What both clients answer at once, from memory: the version, the watcher's state, the
    counters."""

    _native: _native.Directory

    @property
    def version(self) -> int:
        """The directory version this client knows (the one every routed transaction carries)."""
        return self._native.version

    @property
    def connected(self) -> bool:
        """Whether the watcher's connection (or the relay) is up."""
        return self._native.connected

    @property
    def listening(self) -> bool:
        """Whether notifications reach the watcher."""
        return self._native.listening

    @property
    def closed(self) -> bool:
        return self._native.closed

    def stats(self) -> dict[str, Any]:
        """The client's counters (cache hits and misses, invalidations, refusals by reason, ...)."""
        return self.debug()["stats"]

    def debug(self) -> dict[str, Any]:
        """What ``/debug/directory`` serves: the version, the watcher's state, the counters."""
        return json.loads(self._native.debug_json())

    def attempts(
        self,
        entity_type: str,
        entity_id: str | int,
        *,
        read_only: bool = False,
        checked: bool = True,
        shards: Collection[str] | None = None,
        deadline: float = 15.0,
        attempt_timeout: float = 15.0,
        base_backoff: float = 0.01,
        max_backoff: float = 0.5,
    ) -> Attempts:
        """The attempts of one routed transaction run on the application's own connections
        (SQLAlchemy sessions, Django connections): for each, open a transaction on
        ``attempt.shard``, execute ``attempt.stamp`` first in it, and do the work inside
        ``with attempt:``. A refusal (40001) raised in the block is learned from and the loop
        goes on to the next attempt (a write to a frozen entity waits before it); the loop ends
        after the first attempt whose block ends without an error. ``Rejected`` when the core
        gives up; any other error is raised as it is. ``shards``: the shards the application
        reaches (a refusal's ``moved_to`` elsewhere is asked of the directory); None: all.
        The policy is ``Router``'s. For ``AsyncShardDirectory``: ``async for`` and ``async
        with``; the waits run on the client's runtime, never on the event loop."""
        return Attempts(
            self._native,
            entity(entity_type, entity_id),
            read_only=read_only,
            checked=checked,
            shards=shards,
            policy=policy(deadline, attempt_timeout, base_backoff, max_backoff),
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"version={self.version}"
        return f"<{type(self).__name__} {state}>"


class ShardDirectory(_Directory):
    """A connected directory client: an in-process cache tagged with the directory's version,
    invalidated by a watcher (LISTEN with a slow poll, or the relay), filled from the directory
    (or its read replicas, or a shared Redis cache), with an outage policy.

    ``conninfo`` is a libpq connection string. Keyword settings (all optional):
    ``listen`` (False: no LISTEN, only the poll), ``listen_conninfo`` (LISTEN elsewhere than
    ``conninfo``, e.g. past a transaction-mode pooler), ``poll_interval``, ``connect_timeout``,
    ``query_timeout`` (seconds), ``policy`` (``"serve_from_cache"`` or ``"fail_closed"``),
    ``pooled`` (``conninfo`` is a transaction-mode pooler's), ``pool_size``,
    ``max_cached_entries``, ``replicas`` (conninfos of the directory's streaming standbys) and
    ``replica_wait``, ``relay_url`` and ``relay_key`` (follow ``shard-directory relay``) and
    ``relay_silence``, ``shared_cache_url`` (Redis).

    Connecting blocks until the directory answers. ``close()`` (or leaving the ``with``
    block) stops the watcher and the client's threads.
    """

    def __init__(self, conninfo: str, **settings: Any) -> None:
        self._native = _native.Directory(conninfo, **settings)

    def lookup(self, entity_type: str, entity_id: str | int) -> _native.Entry:
        """The entity's entry: from the cache while it is current, else read from the directory.

        Raises ``UnknownEntity``, and while the directory is unreachable ``DirectoryUnavailable``
        or ``FailClosed`` as the policy decides."""
        return self._native.lookup(entity_type, entity_id)

    def refresh(self) -> int:
        """Reads what changed in the directory now; returns the version."""
        return self._native.refresh()

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Waits until this client knows ``version`` (or later); False after ``timeout`` seconds."""
        return self._native.wait_for_version(version, timeout)

    def serve_debug(self, address: str = "127.0.0.1:9000") -> str:
        """Serves ``/debug/directory`` on ``address`` until ``close()``; returns the address."""
        return self._native.serve_debug(address)

    def shard_conninfo(self, shard: str) -> str | None:
        """Where ``shard`` is, from the directory's registry (``shards.conninfo``), if it says."""
        return self._native.shard_conninfo(shard)

    def close(self) -> None:
        """Stops the watcher and the client's threads. Idempotent."""
        self._native.close()

    def __enter__(self) -> ShardDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncShardDirectory(_Directory):
    """``ShardDirectory`` for asyncio: ``await AsyncShardDirectory.connect(conninfo, **settings)``
    (the same settings). A lookup the cache answers returns at once; one that reads the
    directory, and every other call that may wait, runs on a thread, never on the event loop."""

    def __init__(self, native: _native.Directory) -> None:
        if not isinstance(native, _native.Directory):
            raise TypeError("connect with `await AsyncShardDirectory.connect(conninfo, ...)`")
        self._native = native

    @classmethod
    async def connect(cls, conninfo: str, **settings: Any) -> AsyncShardDirectory:
        return cls(await asyncio.to_thread(_native.Directory, conninfo, **settings))

    async def lookup(self, entity_type: str, entity_id: str | int) -> _native.Entry:
        """As ``ShardDirectory.lookup``."""
        cached = self._native.lookup_cached(entity_type, entity_id)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self._native.lookup, entity_type, entity_id)

    async def refresh(self) -> int:
        return await asyncio.to_thread(self._native.refresh)

    async def wait_for_version(self, version: int, timeout: float) -> bool:
        return await asyncio.to_thread(self._native.wait_for_version, version, timeout)

    async def serve_debug(self, address: str = "127.0.0.1:9000") -> str:
        return await asyncio.to_thread(self._native.serve_debug, address)

    async def shard_conninfo(self, shard: str) -> str | None:
        return await asyncio.to_thread(self._native.shard_conninfo, shard)

    async def close(self) -> None:
        """Stops the watcher and the client's threads. Idempotent."""
        await asyncio.to_thread(self._native.close)

    async def __aenter__(self) -> AsyncShardDirectory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
