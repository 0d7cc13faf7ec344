"""The package's conformance driver (conformance/README.md): JSON-lines requests on stdin, one
answer each on stdout, every request on a thread of its own (with ``--asyncio``, a task of its
own on one event loop, through ``AsyncShardDirectory`` and ``AsyncRouter``) so that a write
waiting out a freeze does not hold back the steps that end it.

    shard-directory-conformance --driver "python -m shard_directory.conformance [--asyncio]"
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

import psycopg

from . import _native
from .directory import AsyncShardDirectory, ShardDirectory
from .router import AsyncRouter, Reads, Router

# The reasons `stats` answers for, zeros included (the Rust client's `Stats::rejections`).
_REASONS = ("stale", "missing", "frozen", "moved", "serialization", "other")


class _Protocol(Exception):
    """A request the driver cannot read."""


class Driver:
    def __init__(self) -> None:
        self._out = threading.Lock()
        self._open: tuple[ShardDirectory, Router, dict[str, int]] | None = None

    def answer(self, answer: dict[str, Any]) -> None:
        with self._out:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()

    def handle(self, request: dict[str, Any]) -> None:
        answer: dict[str, Any]
        try:
            answer = {"ok": self._handle(request)}
        except Exception as e:  # every failure is an answer, never a dead thread
            answer = {"error": _error(e)}
        answer["id"] = request.get("id")
        self.answer(answer)

    def _handle(self, r: dict[str, Any]) -> Any:
        op = _text(r, "op")
        if op == "open":
            self._open = _open(r)
            return {}
        if op == "close":
            opened, self._open = self._open, None
            if opened is not None:
                opened[1].close()
                opened[0].close()
            return {}
        if self._open is None:
            raise _Protocol("not open")
        directory, router, baseline = self._open
        if op == "lookup":
            return _lookup(directory.lookup(_text(r, "entity_type"), _text(r, "entity_id")))
        if op in ("write", "read"):
            key, sql, params = _statement(r)
            if op == "write":
                return {"rows": router.run(*key, lambda conn: conn.execute(sql, params).rowcount)}
            return _reads(router.read(*key, lambda conn: conn.execute(sql, params).fetchone()[0]))
        if op == "stats":
            return _stats(directory, baseline)
        raise _Protocol(f"unknown op `{op}`")


class AsyncDriver:
    """The driver on asyncio: each request a task on one event loop."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self._open: tuple[AsyncShardDirectory, AsyncRouter, dict[str, int]] | None = None

    async def handle(self, request: dict[str, Any]) -> None:
        answer: dict[str, Any]
        try:
            answer = {"ok": await self._handle(request)}
        except Exception as e:  # every failure is an answer, never a dead task
            answer = {"error": _error(e)}
        answer["id"] = request.get("id")
        self.answer(answer)

    async def _handle(self, r: dict[str, Any]) -> Any:
        op = _text(r, "op")
        if op == "open":
            directory = await AsyncShardDirectory.connect(_text(r, "directory"), **_settings(r))
            if not await asyncio.to_thread(_ready, directory):
                await directory.close()
                raise _native.ConfigError("the watcher did not connect within 15 s")
            router = await AsyncRouter(directory, r.get("shards", {}), **_policy(r)).open()
            self._open = (directory, router, _rejections(directory))
            return {}
        if op == "close":
            opened, self._open = self._open, None
            if opened is not None:
                await opened[1].close()
                await opened[0].close()
            return {}
        if self._open is None:
            raise _Protocol("not open")
        directory, router, baseline = self._open
        if op == "lookup":
            return _lookup(await directory.lookup(_text(r, "entity_type"), _text(r, "entity_id")))
        if op in ("write", "read"):
            key, sql, params = _statement(r)
            if op == "write":

                async def write(conn: psycopg.AsyncConnection) -> int:
                    return (await conn.execute(sql, params)).rowcount

                return {"rows": await router.run(*key, write)}

            async def read(conn: psycopg.AsyncConnection) -> Any:
                return (await (await conn.execute(sql, params)).fetchone())[0]

            return _reads(await router.read(*key, read))
        if op == "stats":
            return _stats(directory, baseline)
        raise _Protocol(f"unknown op `{op}`")


def _text(r: dict[str, Any], field: str) -> str:
    value = r.get(field)
    if not isinstance(value, str):
        raise _Protocol(f"`{field}` is missing")
    return value


def _statement(r: dict[str, Any]) -> tuple[tuple[str, str], str, dict[str, str]]:
    """A write's or read's entity, its SQL in psycopg's placeholders, and its parameters."""
    key = (_text(r, "entity_type"), _text(r, "entity_id"))
    sql = _text(r, "sql").replace("%", "%%")
    params = {f"p{i}": str(p) for i, p in enumerate(r.get("params", []), start=1)}
    for i in range(len(params), 0, -1):
        sql = sql.replace(f"${i}", f"%(p{i})s")
    return key, sql, params


def _reads(reads: Reads[Any]) -> dict[str, Any]:
    if reads.target_unavailable is not None:
        return {"reads": [reads.source], "target_unavailable": reads.target_unavailable}
    if reads.target is not None:
        return {"reads": [reads.source, reads.target]}
    return {"reads": [reads.source]}


def _stats(directory: ShardDirectory | AsyncShardDirectory, baseline: dict[str, int]) -> Any:
    now = _rejections(directory)
    return {"rejections": {r: now.get(r, 0) - baseline.get(r, 0) for r in _REASONS}}


def _lookup(e: _native.Entry) -> dict[str, Any]:
    return {
        "shard": e.shard_name,
        "target": e.target_shard,
        "state": e.state,
        "version": e.directory_version,
    }


def _rejections(directory: ShardDirectory | AsyncShardDirectory) -> dict[str, int]:
    return dict(directory.stats()["rejections"])


def _settings(r: dict[str, Any]) -> dict[str, Any]:
    """The client's settings an `open` asks for."""
    settings: dict[str, Any] = {}
    if r.get("listen") is False:
        # Told nothing after it connects: no LISTEN, and an hourly poll.
        settings.update(listen=False, poll_interval=3600.0)
    if r.get("pooled"):
        settings["pooled"] = True
    relay = r.get("relay")
    if relay:
        settings.update(relay_url=relay["url"], relay_key=relay["key"].encode())
    return settings


def _policy(r: dict[str, Any]) -> dict[str, float]:
    return {"deadline": r["deadline_ms"] / 1000} if "deadline_ms" in r else {}


def _ready(directory: ShardDirectory | AsyncShardDirectory) -> bool:
    """Open means ready: its watcher (or relay) connected, so that what it caches it keeps."""
    deadline = time.monotonic() + 15
    while not directory.connected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _open(r: dict[str, Any]) -> tuple[ShardDirectory, Router, dict[str, int]]:
    directory = ShardDirectory(_text(r, "directory"), **_settings(r))
    if not _ready(directory):
        directory.close()
        raise _native.ConfigError("the watcher did not connect within 15 s")
    router = Router(directory, r.get("shards", {}), **_policy(r))
    return directory, router, _rejections(directory)


def _error(e: Exception) -> dict[str, Any]:
    """An exception as the driver protocol names it."""
    kind, extra = "other", {}
    if isinstance(e, _Protocol):
        kind = "protocol"
    elif isinstance(e, _native.Rejected):
        kind, extra = "rejected", {"reason": e.reason, "attempts": e.attempts}
    elif isinstance(e, _native.ReadOnly):
        kind = "read_only"
    elif isinstance(e, _native.FailClosed):
        kind, extra = "fail_closed", {"reason": e.reason}
    elif isinstance(e, _native.UnknownEntity):
        kind = "unknown_entity"
    elif isinstance(e, _native.DirectoryBehind):
        kind = "directory_behind"
    elif isinstance(e, _native.DirectoryUnavailable):
        kind = "directory_unavailable"
    elif isinstance(e, (_native.ShardUnavailable, psycopg.OperationalError)):
        kind = "shard_unavailable"
    elif isinstance(e, psycopg.Error):
        kind, extra = "db", {"sqlstate": e.sqlstate}
    return {"kind": kind, "message": str(e), **extra}


async def _main_async(driver: Driver) -> None:
    on_loop = AsyncDriver(driver.answer)
    loop = asyncio.get_running_loop()
    tasks = []
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        try:
            request = json.loads(line)
        except ValueError as e:
            driver.answer({"error": {"kind": "protocol", "message": str(e)}})
            continue
        tasks.append(asyncio.create_task(on_loop.handle(request)))
    await asyncio.gather(*tasks)


def main() -> None:
    driver = Driver()
    if "--asyncio" in sys.argv[1:]:
        asyncio.run(_main_async(driver))
        return
    threads = []
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError as e:
            driver.answer({"error": {"kind": "protocol", "message": str(e)}})
            continue
        t = threading.Thread(target=driver.handle, args=(request,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
