"""A fleet for the package's tests: a directory and two shards, throwaway clusters lent by the
conformance suite's harness (``shard-directory-conformance --fleet 2``), not a harness of ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from shard_directory import Router, ShardDirectory

REPO = Path(__file__).resolve().parents[2]


def conformance_binary() -> str:
    """The suite's binary: ``SD_CONFORMANCE``, or the workspace's debug build."""
    return os.environ.get(
        "SD_CONFORMANCE", str(REPO / "target" / "debug" / "shard-directory-conformance")
    )


class Fleet:
    def __init__(self, addresses: dict[str, Any]) -> None:
        self.directory: str = addresses["directory"]
        self.shards: dict[str, str] = addresses["shards"]

    def sql(self, where: str, statement: str, params: tuple = ()) -> list[tuple]:
        """Runs ``statement`` as the superuser on the directory or a shard; its rows."""
        conninfo = self.directory if where == "directory" else self.shards[where]
        with psycopg.connect(conninfo, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def add_tenant(self, tenant: str, shard: str) -> int:
        """Adds ``tenant`` on ``shard``; returns the directory's version."""
        self.sql(
            "directory",
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) "
            "VALUES ('tenant', %s, %s)",
            (tenant, shard),
        )
        return self.sql("directory", "SELECT shard_directory.current_version()")[0][0]

    def cut_over(self, tenant: str) -> int:
        """Moves ``tenant`` from shard_1 to shard_2 in the directory, and fences it moved on
        shard_1, as a cutover does (no rows copied); the cutover's version."""
        self.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
        self.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))
        version = self.sql(
            "directory", "SELECT shard_directory.complete_move('tenant', %s)", (tenant,)
        )[0][0]
        self.sql(
            "shard_1",
            "SELECT shard_directory.fence_moved('tenant', %s, 'shard_2', %s)",
            (tenant, version),
        )
        return version

    def orders(self, shard: str, tenant: str) -> list[str]:
        rows = self.sql(shard, "SELECT item FROM orders WHERE tenant_id = %s ORDER BY item", (tenant,))
        return [r[0] for r in rows]


class Echoed:
    """A child's stderr, passed on to ours as it comes and kept, so that a failure can say
    what the child said (a run's log may keep only its end)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._pass_on, args=(stream,), daemon=True)
        self.thread.start()

    def _pass_on(self, stream: IO[str]) -> None:
        for line in stream:
            sys.stderr.write(line)
            self.lines.append(line)

    def tail(self, n: int = 20) -> str:
        self.thread.join(timeout=10)
        return "".join(self.lines[-n:])


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    lent = subprocess.Popen(
        [conformance_binary(), "--fleet", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert lent.stderr is not None
    said = Echoed(lent.stderr)
    try:
        assert lent.stdout is not None
        line = lent.stdout.readline()
        assert line, (
            "the fleet did not start (is the extension installed? scripts/test-python.sh); "
            f"it said:\n{said.tail()}"
        )
        yield Fleet(json.loads(line))
    finally:
        # Its stdin ending stops the clusters.
        assert lent.stdin is not None
        lent.stdin.close()
        lent.wait(timeout=120)


_tenants = iter(range(1, 1_000_000))


@pytest.fixture
def tenant(fleet: Fleet) -> str:
    """A tenant of its own on shard_1, for one test."""
    name = f"py{next(_tenants)}"
    fleet.add_tenant(name, "shard_1")
    return name


@pytest.fixture(scope="module")
def directory(fleet: Fleet) -> Iterator[ShardDirectory]:
    """A client of the fleet's directory, for one test module."""
    with ShardDirectory(fleet.directory) as d:
        yield d


@pytest.fixture
def router(fleet: Fleet, directory: ShardDirectory) -> Iterator[Router]:
    """A router over both shards, re-running for at most 2 s."""
    with Router(directory, fleet.shards, deadline=2.0) as r:
        yield r


@pytest.fixture
def engines(fleet: Fleet) -> Iterator[dict[str, Any]]:
    """An SQLAlchemy engine per shard, its own pool, on psycopg 3."""
    from sqlalchemy import URL, create_engine

    made = {}
    for name, conninfo in fleet.shards.items():
        c = conninfo_to_dict(conninfo)
        url = URL.create(
            "postgresql+psycopg", c.get("user"), None, c["host"], int(c["port"]), c["dbname"]
        )
        made[name] = create_engine(url)
    yield made
    for engine in made.values():
        engine.dispose()


def client_threads() -> int:
    """Threads of this process the client's runtime named (what close() must end)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return sum(1 for n in names if n.startswith("shard-directo"))
