"""``ShardDirectory.attempts``: a routed transaction on connections the application owns
(SQLAlchemy's sessions, Django's connections, a pool of its own). The core decides each
attempt's shard and stamp, and what a refusal teaches, as it does for ``Router``; the
application opens the transaction on that shard, runs the stamp first in it, and does its work
inside ``with attempt:``, which learns from a refusal (SQLSTATE 40001) and asks for the next
attempt, or raises what no re-run cures::

    for attempt in directory.attempts("tenant", "8842"):
        with attempt, Session(engines[attempt.shard]) as session, session.begin():
            session.connection().exec_driver_sql(*attempt.stamp)
            session.add(Order(tenant_id="8842", item="book"))

``AsyncShardDirectory.attempts`` is the same with ``async for`` and ``async with``. Also here:
the stamp statements, the retry policy's form, and ``soon``, a decision of the core awaited
without a thread of the event loop's (the routers' too).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any

from . import _native
from ._refusals import error, left_the_transaction, refusal, rejected, unstamped

# The stamp, by what it checks (docs/protocol.md §6): a write's, a read's, none.
STAMP = {check: _native.stamp_sql(check) for check in ("write", "read", "unchecked")}


def policy(
    deadline: float, attempt_timeout: float, base_backoff: float, max_backoff: float
) -> dict[str, float]:
    """A routed transaction's retry policy, as the core takes it (seconds)."""
    return {
        "deadline": deadline,
        "attempt_timeout": attempt_timeout,
        "base_backoff": base_backoff,
        "max_backoff": max_backoff,
    }


async def soon(start: Callable[[Callable[[bool, Any], None]], _native.Pending]) -> Any:
    """A decision of the core made on its runtime, awaited without a thread of the loop's: the
    core calls back with the answer; a cancelled wait stops it there (a freeze's or a backoff's
    wait ends with the task that awaited it)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if answer.done():
            return
        if ok:
            answer.set_result(value)
        else:
            answer.set_exception(value)

    def done(ok: bool, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, ok, value)

    pending = start(done)
    try:
        return await answer
    except asyncio.CancelledError:
        pending.cancel()
        raise


def _database_error(e: BaseException | None) -> Any:
    """The driver's error under ``e`` (psycopg's, however a framework wrapped it: SQLAlchemy's
    ``.orig``, Django's ``__cause__``), or None. One of this package's own errors is never
    looked under: a ``Rejected`` of another routed call holds that call's refusal, not this
    attempt's."""
    for _ in range(8):
        if e is None or isinstance(e, _native.ShardDirectoryError):
            return None
        if hasattr(e, "sqlstate") and hasattr(e, "diag"):
            return e
        orig = getattr(e, "orig", None)
        e = orig if isinstance(orig, BaseException) else e.__cause__
    return None


class Attempt:
    """One attempt: run the transaction on ``shard``, ``stamp`` (the statement and its
    parameters, psycopg's ``%(name)s`` style) first in it, all inside ``with attempt:``
    (``async with`` for ``AsyncShardDirectory.attempts``)."""

    def __init__(self, attempts: Attempts, route: _native.Route, check: str) -> None:
        self._attempts = attempts
        self._route = route
        self.entry: _native.Entry = route.entry
        self.shard: str = route.entry.shard_name
        self.number: int = route.attempt
        self.stamp: tuple[str, dict[str, str]] = (STAMP[check], route.stamp_params)
        self.time_left: float = route.time_left
        self.ended = False

    def _refused(self, exc: BaseException | None) -> tuple[Any, tuple[str, str | None]] | None:
        """Marks the attempt ended; the refusal that ended it, if one did. Raises when no
        re-run may follow it."""
        self.ended = True
        if exc is None:
            self._attempts._done = True
            return None
        db = _database_error(exc)
        refused = refusal(db) if db is not None else None
        if refused is None:
            return None
        if unstamped(db):
            self._attempts._done = True
            raise left_the_transaction(
                self._attempts.entity, self.shard, "ran a statement without the stamp"
            ) from exc
        return db, refused

    def _gave_up(self, db: Any, exc: BaseException) -> Exception:
        self._attempts._done = True
        e = rejected(self._route, db, self._attempts.entity)
        e.__context__ = exc
        return e

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        found = self._refused(exc)
        if found is None:
            return False
        db, refused = found
        a = self._attempts
        if a._routing.refused(self._route, *refused, a._can_route_to):
            return True  # learned from: the loop asks for the next attempt
        raise self._gave_up(db, exc)  # type: ignore[arg-type]

    async def __aenter__(self) -> Attempt:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        found = self._refused(exc)
        if found is None:
            return False
        db, refused = found
        a = self._attempts
        again = await soon(
            lambda done: a._routing.refused_soon(self._route, *refused, a._can_route_to, done)
        )
        if again:
            return True
        raise self._gave_up(db, exc)  # type: ignore[arg-type]


class Attempts:
    """The attempts of one routed transaction, iterated once, until one ends without an
    error (``async for`` on ``AsyncShardDirectory.attempts``)."""

    def __init__(
        self,
        native: _native.Directory,
        entity: tuple[str, str],
        *,
        read_only: bool,
        checked: bool,
        shards: Collection[str] | None,
        policy: dict[str, float],
    ) -> None:
        self.entity = entity
        self._routing = native.routing(*entity, write=not read_only, **policy)
        self._check = "write" if not read_only else ("read" if checked else "unchecked")
        self._shards = None if shards is None else frozenset(shards)
        self._done = False
        self._over = False
        self._current: Attempt | None = None

    def _can_route_to(self, shard: str) -> bool:
        return self._shards is None or shard in self._shards

    def _before_next(self) -> bool:
        """Whether the iteration is over (then it is, once: a second loop over the same
        attempts is refused, not silently skipped)."""
        if self._over:
            raise RuntimeError("these attempts were used: ask directory.attempts() again")
        if self._done:
            self._over = True
            return True
        if self._current is not None and not self._current.ended:
            raise RuntimeError("run each attempt inside `with attempt:` (it learns from a refusal)")
        return False

    def _attempt(self, route: _native.Route) -> Attempt:
        shard = route.entry.shard_name
        if not self._can_route_to(shard):
            self._done = self._over = True
            raise error(
                _native.UnknownShard,
                f'entry {self.entity[0]}/{self.entity[1]} names shard "{shard}", which is not '
                "among the shards given",
                shard=shard,
                entity_type=self.entity[0],
                entity_id=self.entity[1],
                retryable=False,
            )
        self._current = Attempt(self, route, self._check)
        return self._current

    def __iter__(self) -> Attempts:
        return self

    def __next__(self) -> Attempt:
        if self._before_next():
            raise StopIteration
        return self._attempt(self._routing.next())

    def __aiter__(self) -> Attempts:
        return self

    async def __anext__(self) -> Attempt:
        if self._before_next():
            raise StopAsyncIteration
        return self._attempt(await soon(self._routing.next_soon))


__all__ = ["Attempt", "Attempts"]
