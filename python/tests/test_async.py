"""``AsyncShardDirectory`` and ``AsyncRouter``: the same behaviour as the synchronous ones, and
nothing that waits on the event loop."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

import shard_directory
from shard_directory import AsyncRouter, AsyncShardDirectory, Reads

ORDER = "INSERT INTO orders (tenant_id, item) VALUES (%s, %s)"


def test_a_cached_lookup_answers_on_the_loop_and_a_miss_does_not_block_it(fleet, tenant) -> None:
    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as directory:
            # A heartbeat on the loop: a lookup that blocked it would stall the ticks.
            ticks = 0

            async def beat() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            heart = asyncio.create_task(beat())
            await asyncio.sleep(0.01)
            before = ticks
            entry = await directory.lookup("tenant", tenant)  # a miss: read on a thread
            assert entry.shard_name == "shard_1"
            hits = directory.stats()["cache_hits"]
            assert await directory.lookup("tenant", tenant) == entry
            assert directory.stats()["cache_hits"] == hits + 1
            heart.cancel()
            assert ticks > before, "the loop went on while the miss was read"
            with pytest.raises(shard_directory.UnknownEntity):
                await directory.lookup("tenant", "no-such-tenant")

    asyncio.run(main())


def test_run_commits_on_the_owning_shard_and_read_reads_both_while_migrating(fleet, tenant) -> None:
    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as directory:
            async with AsyncRouter(directory, fleet.shards, deadline=2.0) as router:

                async def order(conn: psycopg.AsyncConnection) -> str:
                    await conn.execute(ORDER, (tenant, "async"))
                    cur = await conn.execute("SELECT current_setting('app.directory_version')")
                    return (await cur.fetchone())[0]

                assert await router.run("tenant", tenant, order) == str(directory.version)
                assert fleet.orders("shard_1", tenant) == ["async"]

                version = fleet.sql(
                    "directory",
                    "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')",
                    (tenant,),
                )[0][0]
                assert await directory.wait_for_version(version, timeout=10)

                async def count(conn: psycopg.AsyncConnection) -> int:
                    cur = await conn.execute(
                        "SELECT count(*) FROM orders WHERE tenant_id = %s", (tenant,)
                    )
                    return (await cur.fetchone())[0]

                assert await router.read("tenant", tenant, count) == Reads(source=1, target=0)
                fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))

    asyncio.run(main())


def test_a_frozen_write_waits_off_the_loop_and_is_read_only_past_the_deadline(fleet, tenant) -> None:
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    version = fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))[0][0]

    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as directory:
            assert await directory.wait_for_version(version, timeout=10)
            # Backoffs of 0.4-0.8 s: a wait that gave up when the next backoff would pass the
            # deadline would end a backoff early, not at the deadline.
            async with AsyncRouter(
                directory, fleet.shards, deadline=1.0, base_backoff=0.4, max_backoff=0.8
            ) as router:
                started = time.monotonic()

                async def late(conn: psycopg.AsyncConnection) -> None:
                    await conn.execute(ORDER, (tenant, "late"))

                other = asyncio.create_task(asyncio.sleep(0.05))
                with pytest.raises(shard_directory.ReadOnly):
                    await router.run("tenant", tenant, late)
                assert other.done(), "the loop ran other tasks during the wait"
                assert 1.0 <= time.monotonic() - started < 2.0

    asyncio.run(main())
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []
    fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))
