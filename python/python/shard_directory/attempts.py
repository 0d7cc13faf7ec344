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
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from types import TracebackType
from typing import Any

from . import _native
from ._refusals import refusal, rejected

# The stamp, by what it checks (docs/protocol.md §6): a write's, a read's, none.
STAMP = {check: _native.stamp_sql(check) for check in ("write", "read", "unchecked")}


def _database_error(e: BaseException | None) -> Any:
    """The driver's error under ``e`` (psycopg's, however a framework wrapped it: SQLAlchemy's
    ``.orig``, Django's ``__cause__``), or None."""
    seen = 0
    while e is not None and seen < 8:
        if hasattr(e, "sqlstate") and hasattr(e, "diag"):
            return e
        e = getattr(e, "orig", None) or e.__cause__
        seen += 1
    return None


class Attempt:
    """One attempt: run the transaction on ``shard``, ``stamp`` (the statement and its
    parameters, psycopg's ``%(name)s`` style) first in it, all inside ``with attempt:``."""

    def __init__(self, attempts: Attempts, route: _native.Route, check: str) -> None:
        self._attempts = attempts
        self._route = route
        self.entry: _native.Entry = route.entry
        self.shard: str = route.entry.shard_name
        self.number: int = route.attempt
        self.stamp: tuple[str, dict[str, str]] = (STAMP[check], route.stamp_params)
        self.time_left: float = route.time_left
        self.ended = False

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self.ended = True
        if exc is None:
            self._attempts._done = True
            return False
        db = _database_error(exc)
        refused = refusal(db) if db is not None else None
        if refused is None:
            return False
        a = self._attempts
        if a._routing.refused(self._route, *refused, a._can_route_to):
            return True  # learned from: the loop asks for the next attempt
        raise rejected(self._route, db, a.entity) from exc


class Attempts:
    """The attempts of one routed transaction, iterated until one ends without an error."""

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
        self._current: Attempt | None = None

    def _can_route_to(self, shard: str) -> bool:
        return self._shards is None or shard in self._shards

    def __iter__(self) -> Iterator[Attempt]:
        return self

    def __next__(self) -> Attempt:
        if self._done:
            raise StopIteration
        if self._current is not None and not self._current.ended:
            raise RuntimeError("run each attempt inside `with attempt:` (it learns from a refusal)")
        self._current = Attempt(self, self._routing.next(), self._check)
        return self._current


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
