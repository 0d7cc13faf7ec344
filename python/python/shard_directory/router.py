"""``Router``: each transaction on the shard the directory names, on psycopg connections pooled
per shard, opened by the stamp (the client's directory version and the entity, set for the
transaction, and the shard's check, in one statement) and re-run when a shard refuses the route
(SQLSTATE 40001), as the Rust core decides (docs/protocol.md, §6-§10). ``AsyncRouter``: the same
on psycopg's asyncio connections; the core's decisions, which may wait, run on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from . import _native
from .attempts import STAMP, policy as _retry_policy, soon
from ._refusals import caught_and_aborted, error as _error, left_the_transaction, refusal as _refusal, rejected as _rejected, unstamped
from .directory import AsyncShardDirectory, ShardDirectory, entity as _entity

T = TypeVar("T")

# BEGIN and the stamp are sent together, in one round trip (psycopg's pipeline mode, libpq 14 or
# later): a routed transaction then costs the round trips of a plain one. The block itself runs
# outside the pipeline, each statement answered as the application expects.
_PIPELINE = psycopg.Pipeline.is_supported()


@dataclasses.dataclass(frozen=True)
class Reads(Generic[T]):
    """What a read returned: the owning shard's answer, and while the entity is ``migrating``
    its target's too (or why the target could not be read: the source still holds every row)."""

    source: T
    target: T | None = None
    target_unavailable: str | None = None

    @property
    def both(self) -> bool:
        """Whether the entity was ``migrating`` and both shards answered."""
        return self.target_unavailable is None and self.target is not None

    def merge(self, combine: Callable[[T, T], T]) -> T:
        """Both answers combined by ``combine`` while migrating, else the one there is."""
        if self.both:
            return combine(self.source, self.target)  # type: ignore[arg-type]
        return self.source


class _Dead(Exception):
    """The pooled connection was gone before the stamp reached the shard (the shard restarted, or
    ended the session): nothing was sent, and the attempt is made again on a new one."""


def _unreachable(e: BaseException) -> bool:
    """Whether ``e`` says the shard could not be reached (not an error it answered with)."""
    if isinstance(e, _native.ShardUnavailable):
        return True
    if not isinstance(e, psycopg.OperationalError):
        return False
    code = e.sqlstate
    return code is None or code.startswith("08") or code in ("57P01", "57P02", "57P03")


def _still_open(conn: Any, entity: tuple[str, str], shard: str) -> None:
    """Before COMMIT: the routed transaction is still the one open. An error the caller caught
    aborted it (COMMIT would roll it back, silently: ``Aborted``); a COMMIT or ROLLBACK
    statement of the block's own ended it (what followed ran unstamped); the connection was
    lost (nothing was committed: ``ShardUnavailable``)."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return
    if status == TransactionStatus.INERROR:
        raise caught_and_aborted(entity, shard)
    if status == TransactionStatus.IDLE:
        raise left_the_transaction(entity, shard, "ended the transaction itself")
    raise _error(
        _native.ShardUnavailable,
        f'{entity[0]}/{entity[1]}: the connection to shard "{shard}" was lost before COMMIT; '
        "nothing was committed",
        shard=shard,
        retryable=True,
    )


def _closed() -> Exception:
    return _error(_native.ConfigError, "the router is closed", retryable=False)


class _Routes:
    """What both routers share: the shards' conninfos and pools, the retry policy, and what a
    refusal is worth (the core decides; this only asks it and names the result)."""

    def __init__(
        self,
        shards: Mapping[str, str] | None,
        learn_shards: str | None,
        pool_size: int,
        connect_timeout: float,
        prepare: bool,
        policy: dict[str, float],
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise _error(_native.ConfigError, f"pool_size: {pool_size!r}", retryable=False)
        for name, value in {"connect_timeout": connect_timeout, **policy}.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise _error(_native.ConfigError, f"{name}: {value!r} s", retryable=False)
        self._learn = learn_shards
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._prepare = prepare
        self._policy = policy
        self._lock = threading.Lock()
        self._pools: dict[str, Any] = {}
        self._closed = False
        for name, conninfo in (shards or {}).items():
            self._pools[name] = self._new_pool(name, conninfo)

    def _new_pool(self, name: str, conninfo: str) -> Any:
        raise NotImplementedError

    def _pool_settings(self, name: str, conninfo: str) -> dict[str, Any]:
        kwargs: dict[str, object] = {"autocommit": True}
        if not self._prepare:
            kwargs["prepare_threshold"] = None
        return {
            "conninfo": make_conninfo(
                conninfo, connect_timeout=max(1, round(self._connect_timeout))
            ),
            "min_size": 0,
            "max_size": self._pool_size,
            "kwargs": kwargs,
            "name": f"shard_directory:{name}",
        }

    def _check_open(self) -> None:
        with self._lock:
            if self._closed:
                raise _closed()

    def _known_pool(self, shard: str, entity: tuple[str, str]) -> Any:
        """The pool of ``shard`` if this router has one; ``UnknownShard`` if it cannot learn it."""
        with self._lock:
            if self._closed:
                raise _closed()
            pool = self._pools.get(shard)
        if pool is None and self._learn is None:
            raise self._unknown(shard, entity)
        return pool

    def _unknown(self, shard: str, entity: tuple[str, str]) -> Exception:
        return _error(
            _native.UnknownShard,
            f'no connection settings for shard "{shard}" (entry {entity[0]}/{entity[1]})',
            shard=shard,
            entity_type=entity[0],
            entity_id=entity[1],
            retryable=False,
        )

    def _learned_pool(self, shard: str, entity: tuple[str, str], registered: str | None) -> Any:
        """The pool of ``shard`` at ``registered`` (its registry's conninfo), as ``learn_shards``."""
        if registered is None or self._learn is None:
            raise self._unknown(shard, entity)
        conninfo = make_conninfo(registered, **conninfo_to_dict(self._learn))
        with self._lock:
            # Closed while the registry was read: no pool is left behind.
            if self._closed:
                raise _closed()
            if shard not in self._pools:
                self._pools[shard] = self._new_pool(shard, conninfo)
            return self._pools[shard]

    def _can_route_to(self, shard: str) -> bool:
        with self._lock:
            return self._learn is not None or shard in self._pools

    def _routing(
        self, directory: ShardDirectory | AsyncShardDirectory, entity: tuple[str, str], write: bool
    ) -> _native.Routing:
        self._check_open()
        return directory._native.routing(*entity, write=write, **self._policy)

    @staticmethod
    def _unavailable(shard: str, e: PoolTimeout) -> Exception:
        return _error(
            _native.ShardUnavailable,
            f'shard "{shard}" unavailable: {e}',
            shard=shard,
            retryable=True,
        )

    def _take_pools(self) -> list[Any]:
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        return pools


def _begin(conn: Any, read_only: bool, isolation: IsolationLevel | None) -> None:
    """How the next transaction on ``conn`` begins (set only when it changes: psycopg then
    rebuilds its BEGIN)."""
    if conn.read_only != read_only:
        conn.read_only = read_only
    if conn.isolation_level != isolation:
        conn.isolation_level = isolation


def _not_awaitable(result: T) -> T:
    """``result``, unless it is a coroutine (an ``async def`` passed to the synchronous router):
    then ``TypeError``, and the transaction rolls back."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError("the function returned an awaitable: use AsyncRouter for coroutines")
    return result


class Router(_Routes):
    """Routes each transaction to the shard the directory names.

    ``shards`` maps each shard's name (``shards.shard_name``) to a libpq conninfo. With
    ``learn_shards`` (a conninfo fragment, e.g. ``"user=app password=..."``), a shard it was not
    given is found in the directory's registry (``shards.conninfo``), connected to as that user.
    ``pool_size`` connections per shard; ``prepare=False`` behind a transaction-mode pooler.
    A transaction may be re-run until ``deadline`` seconds after its first attempt; each attempt
    has at most ``attempt_timeout`` (its statements are bounded by it on the server); the
    backoff between attempts goes from ``base_backoff`` to ``max_backoff``.
    """

    def __init__(
        self,
        directory: ShardDirectory,
        shards: Mapping[str, str] | None = None,
        *,
        learn_shards: str | None = None,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        prepare: bool = True,
        deadline: float = 15.0,
        attempt_timeout: float = 15.0,
        base_backoff: float = 0.01,
        max_backoff: float = 0.5,
    ) -> None:
        self.directory = directory
        policy = _retry_policy(deadline, attempt_timeout, base_backoff, max_backoff)
        super().__init__(shards, learn_shards, pool_size, connect_timeout, prepare, policy)

    def _new_pool(self, name: str, conninfo: str) -> ConnectionPool:
        return ConnectionPool(open=True, **self._pool_settings(name, conninfo))

    def _pool(self, shard: str, entity: tuple[str, str]) -> ConnectionPool:
        """The pool of ``shard``, learned from the registry when allowed."""
        pool = self._known_pool(shard, entity)
        if pool is not None:
            return pool
        return self._learned_pool(shard, entity, self.directory.shard_conninfo(shard))

    @contextlib.contextmanager
    def _stamped(
        self,
        shard: str,
        entity: tuple[str, str],
        route: _native.Route,
        check: str,
        read_only: bool,
        isolation: IsolationLevel | None,
    ) -> Iterator[psycopg.Connection]:
        """One transaction on ``shard``, begun and stamped; committed when the block ends."""
        pool = self._pool(shard, entity)
        try:
            conn_cm = pool.connection(timeout=max(route.time_left, 0.001))
            conn = conn_cm.__enter__()
        except PoolTimeout as e:
            raise self._unavailable(shard, e) from e
        except PoolClosed as e:
            raise _closed() from e
        with contextlib.ExitStack() as stack:
            stack.push(conn_cm)
            stamped = False
            try:
                _begin(conn, read_only, isolation)
                tx = psycopg.Transaction(conn)
                with conn.pipeline() if _PIPELINE else contextlib.nullcontext():
                    tx.__enter__()
                    stack.push(tx)  # committed (or rolled back) before the pool has it back
                    conn.execute(STAMP[check], route.stamp_params)
                stamped = True
                yield conn
                _still_open(conn, entity, shard)
            except psycopg.OperationalError as e:
                if not stamped and conn.broken:
                    raise _Dead() from e
                raise

    def _again(
        self, routing: _native.Routing, route: _native.Route, e: psycopg.Error, entity: tuple[str, str]
    ) -> None:
        """Returns when ``e`` is a refusal worth re-running the transaction for (repaired, and
        the backoff waited, by the core); raises ``e`` when it is not a refusal, ``Rejected``
        when the core gives up on it."""
        refusal = _refusal(e)
        if refusal is None:
            raise e
        if unstamped(e):
            raise left_the_transaction(
                entity, route.entry.shard_name, "ran a statement without the stamp"
            ) from e
        if not routing.refused(route, *refusal, self._can_route_to):
            raise _rejected(route, e, entity)

    def run(
        self,
        entity_type: str,
        entity_id: str | int,
        fn: Callable[[psycopg.Connection], T],
        *,
        read_only: bool = False,
        isolation: IsolationLevel | None = None,
    ) -> T:
        """Runs ``fn(conn)`` as one transaction on the shard that owns the entity, stamped and
        checked; re-runs the whole of ``fn`` when a shard refuses the route (40001), on the
        repaired route, until the deadline (then ``Rejected``). While the entity is ``read_only``
        a write sends nothing and waits for the cutover to end (``ReadOnly`` past the
        deadline). An exception of ``fn`` rolls back and is raised as it is (``psycopg.Rollback``
        rolls back and returns None, as in psycopg's own blocks). A block that ends the
        transaction itself (a COMMIT statement) is ``Aborted``, never re-run."""
        if inspect.iscoroutinefunction(fn):
            raise TypeError("Router.run takes a plain function: use AsyncRouter for coroutines")
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=not read_only)
        check = "read" if read_only else "write"
        while True:
            route = routing.next()
            try:
                with self._stamped(
                    route.entry.shard_name, entity, route, check, read_only, isolation
                ) as conn:
                    return _not_awaitable(fn(conn))
                return None  # type: ignore[return-value]  # fn raised psycopg.Rollback
            except _Dead:
                continue
            except psycopg.Error as e:
                self._again(routing, route, e, entity)

    def read(
        self,
        entity_type: str,
        entity_id: str | int,
        fn: Callable[[psycopg.Connection], T],
        *,
        checked: bool = True,
    ) -> Reads[T]:
        """Runs ``fn(conn)`` as a read-only transaction, checked as a write is (a shard that gave
        the entity away refuses it, and it is re-run), and on both shards while the entity is
        ``migrating``. ``checked=False`` accepts an answer from a shard that gave it away."""
        if inspect.iscoroutinefunction(fn):
            raise TypeError("Router.read takes a plain function: use AsyncRouter for coroutines")
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=False)
        check = "read" if checked else "unchecked"
        while True:
            route = routing.next()
            try:
                shard = route.entry.shard_name
                source = None  # fn may raise psycopg.Rollback: rolled back, None
                with self._stamped(shard, entity, route, check, True, None) as conn:
                    source = _not_awaitable(fn(conn))
                target = route.entry.target_shard
                if route.entry.state != "migrating" or target is None:
                    return Reads(source)
                try:
                    with self._stamped(target, entity, route, check, True, None) as conn:
                        return Reads(source, _not_awaitable(fn(conn)))
                except (_native.ShardUnavailable, psycopg.OperationalError, _Dead) as e:
                    # The source still owns every row; a refusal of the target's is a refusal.
                    if not isinstance(e, _Dead) and not _unreachable(e):
                        raise
                    return Reads(source, target_unavailable=str(e.__cause__ or e))
            except _Dead:
                continue
            except psycopg.Error as e:
                self._again(routing, route, e, entity)

    @contextlib.contextmanager
    def transaction(
        self,
        entity_type: str,
        entity_id: str | int,
        *,
        read_only: bool = False,
        isolation: IsolationLevel | None = None,
    ) -> Iterator[psycopg.Connection]:
        """One transaction on the entity's shard, stamped and checked, committed when the block
        ends. A refusal of the stamp (nothing of the block ran) is repaired and the transaction
        begun again; a write waits out a freeze. A refusal raised in the block, or at commit,
        cannot re-run it: it is learned from (so the next transaction is routed right) and raised
        as psycopg's ``SerializationFailure``; ``run()`` re-runs a callable instead."""
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=not read_only)
        check = "read" if read_only else "write"
        while True:
            route = routing.next()
            began = False
            try:
                with self._stamped(
                    route.entry.shard_name, entity, route, check, read_only, isolation
                ) as conn:
                    began = True
                    yield conn
                return
            except _Dead:
                continue
            except psycopg.Error as e:
                refusal = _refusal(e)
                if not began:
                    self._again(routing, route, e, entity)
                    continue
                if refusal is not None:
                    routing.refused(route, *refusal, self._can_route_to)
                raise

    def close(self) -> None:
        """Closes every shard's pool. Idempotent."""
        for pool in self._take_pools():
            pool.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRouter(_Routes):
    """``Router`` for asyncio, on ``psycopg.AsyncConnection``s pooled per shard
    (``psycopg_pool.AsyncConnectionPool``); the same settings. ``fn`` is a coroutine function.
    Open it with ``async with AsyncRouter(...)`` or ``await router.open()``."""

    def __init__(
        self,
        directory: AsyncShardDirectory,
        shards: Mapping[str, str] | None = None,
        *,
        learn_shards: str | None = None,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        prepare: bool = True,
        deadline: float = 15.0,
        attempt_timeout: float = 15.0,
        base_backoff: float = 0.01,
        max_backoff: float = 0.5,
    ) -> None:
        self.directory = directory
        policy = _retry_policy(deadline, attempt_timeout, base_backoff, max_backoff)
        super().__init__(shards, learn_shards, pool_size, connect_timeout, prepare, policy)

    def _new_pool(self, name: str, conninfo: str) -> AsyncConnectionPool:
        # Opened on first use, inside the event loop (an asyncio pool cannot open outside one).
        return AsyncConnectionPool(open=False, **self._pool_settings(name, conninfo))

    async def open(self) -> AsyncRouter:
        """Opens the pools of the shards it was given."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            await pool.open()
        return self

    async def _pool(self, shard: str, entity: tuple[str, str]) -> AsyncConnectionPool:
        pool = self._known_pool(shard, entity)
        if pool is None:
            registered = await self.directory.shard_conninfo(shard)
            pool = self._learned_pool(shard, entity, registered)
        if pool.closed:
            await pool.open()
        return pool

    @contextlib.asynccontextmanager
    async def _stamped(
        self,
        shard: str,
        entity: tuple[str, str],
        route: _native.Route,
        check: str,
        read_only: bool,
        isolation: IsolationLevel | None,
    ) -> AsyncIterator[psycopg.AsyncConnection]:
        pool = await self._pool(shard, entity)
        try:
            conn_cm = pool.connection(timeout=max(route.time_left, 0.001))
            conn = await conn_cm.__aenter__()
        except PoolTimeout as e:
            raise self._unavailable(shard, e) from e
        except PoolClosed as e:
            raise _closed() from e
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(conn_cm)
            stamped = False
            try:
                if conn.read_only != read_only:
                    await conn.set_read_only(read_only)
                if conn.isolation_level != isolation:
                    await conn.set_isolation_level(isolation)
                tx = psycopg.AsyncTransaction(conn)
                async with conn.pipeline() if _PIPELINE else contextlib.nullcontext():
                    await tx.__aenter__()
                    stack.push_async_exit(tx)
                    await conn.execute(STAMP[check], route.stamp_params)
                stamped = True
                yield conn
                _still_open(conn, entity, shard)
            except psycopg.OperationalError as e:
                if not stamped and conn.broken:
                    raise _Dead() from e
                raise

    async def _again(
        self, routing: _native.Routing, route: _native.Route, e: psycopg.Error, entity: tuple[str, str]
    ) -> None:
        refusal = _refusal(e)
        if refusal is None:
            raise e
        if unstamped(e):
            raise left_the_transaction(
                entity, route.entry.shard_name, "ran a statement without the stamp"
            ) from e
        again = await soon(
            lambda done: routing.refused_soon(route, *refusal, self._can_route_to, done)
        )
        if not again:
            raise _rejected(route, e, entity)

    async def run(
        self,
        entity_type: str,
        entity_id: str | int,
        fn: Callable[[psycopg.AsyncConnection], Awaitable[T]],
        *,
        read_only: bool = False,
        isolation: IsolationLevel | None = None,
    ) -> T:
        """As ``Router.run``, awaiting ``fn(conn)``."""
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=not read_only)
        check = "read" if read_only else "write"
        while True:
            route = await soon(routing.next_soon)
            try:
                async with self._stamped(
                    route.entry.shard_name, entity, route, check, read_only, isolation
                ) as conn:
                    return await fn(conn)
                return None  # type: ignore[return-value]  # fn raised psycopg.Rollback
            except _Dead:
                continue
            except psycopg.Error as e:
                await self._again(routing, route, e, entity)

    async def read(
        self,
        entity_type: str,
        entity_id: str | int,
        fn: Callable[[psycopg.AsyncConnection], Awaitable[T]],
        *,
        checked: bool = True,
    ) -> Reads[T]:
        """As ``Router.read``, awaiting ``fn(conn)``."""
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=False)
        check = "read" if checked else "unchecked"
        while True:
            route = await soon(routing.next_soon)
            try:
                shard = route.entry.shard_name
                source = None  # fn may raise psycopg.Rollback: rolled back, None
                async with self._stamped(shard, entity, route, check, True, None) as conn:
                    source = await fn(conn)
                target = route.entry.target_shard
                if route.entry.state != "migrating" or target is None:
                    return Reads(source)
                try:
                    async with self._stamped(target, entity, route, check, True, None) as conn:
                        return Reads(source, await fn(conn))
                except (_native.ShardUnavailable, psycopg.OperationalError, _Dead) as e:
                    if not isinstance(e, _Dead) and not _unreachable(e):
                        raise
                    return Reads(source, target_unavailable=str(e.__cause__ or e))
            except _Dead:
                continue
            except psycopg.Error as e:
                await self._again(routing, route, e, entity)

    @contextlib.asynccontextmanager
    async def transaction(
        self,
        entity_type: str,
        entity_id: str | int,
        *,
        read_only: bool = False,
        isolation: IsolationLevel | None = None,
    ) -> AsyncIterator[psycopg.AsyncConnection]:
        """As ``Router.transaction``: ``async with router.transaction(...) as conn``."""
        entity = _entity(entity_type, entity_id)
        routing = self._routing(self.directory, entity, write=not read_only)
        check = "read" if read_only else "write"
        while True:
            route = await soon(routing.next_soon)
            began = False
            try:
                async with self._stamped(
                    route.entry.shard_name, entity, route, check, read_only, isolation
                ) as conn:
                    began = True
                    yield conn
                return
            except _Dead:
                continue
            except psycopg.Error as e:
                refusal = _refusal(e)
                if not began:
                    await self._again(routing, route, e, entity)
                    continue
                if refusal is not None:
                    await soon(
                        lambda done: routing.refused_soon(
                            route, *refusal, self._can_route_to, done
                        )
                    )
                raise

    async def close(self) -> None:
        """Closes every shard's pool. Idempotent."""
        for pool in self._take_pools():
            await pool.close()

    async def __aenter__(self) -> AsyncRouter:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
