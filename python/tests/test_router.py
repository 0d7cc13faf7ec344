"""``Router``: stamped and checked transactions on psycopg connections, pooled per shard."""

from __future__ import annotations

import time

import psycopg
import pytest

import shard_directory
from shard_directory import Reads, Router, ShardDirectory

ORDER = "INSERT INTO orders (tenant_id, item) VALUES (%s, %s)"


def test_run_commits_once_on_the_owning_shard_stamped_with_the_version(
    fleet, directory, router, tenant
) -> None:
    def order(conn: psycopg.Connection) -> tuple[str, str, str]:
        conn.execute(ORDER, (tenant, "book"))
        return conn.execute(
            "SELECT current_setting('app.directory_version'), current_setting('app.entity_type'),"
            " current_setting('app.entity_id')"
        ).fetchone()

    stamped = router.run("tenant", tenant, order)
    assert stamped == (str(directory.version), "tenant", tenant)
    assert fleet.orders("shard_1", tenant) == ["book"]
    assert fleet.orders("shard_2", tenant) == []


def test_a_transaction_block_commits_at_its_end_and_rolls_back_on_an_exception(
    fleet, router, tenant
) -> None:
    with router.transaction("tenant", tenant) as conn:
        conn.execute(ORDER, (tenant, "pen"))
        assert fleet.orders("shard_1", tenant) == [], "not before the block ends"
    assert fleet.orders("shard_1", tenant) == ["pen"]

    class Oops(Exception):
        pass

    with pytest.raises(Oops):
        with router.transaction("tenant", tenant) as conn:
            conn.execute(ORDER, (tenant, "ink"))
            raise Oops
    assert fleet.orders("shard_1", tenant) == ["pen"]


def test_the_callables_own_error_is_raised_as_it_is_and_not_retried(fleet, router, tenant) -> None:
    calls = []

    def twice(conn: psycopg.Connection) -> None:
        calls.append(1)
        conn.execute(ORDER, (tenant, "dup"))
        conn.execute("SELECT 1/0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        router.run("tenant", tenant, twice)
    assert calls == [1]
    assert fleet.orders("shard_1", tenant) == []


def test_a_write_to_a_frozen_tenant_sends_nothing_and_is_read_only_past_the_deadline(
    fleet, directory, router, tenant
) -> None:
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    version = fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))[0][0]
    assert directory.wait_for_version(version, timeout=10)
    started = time.monotonic()
    with pytest.raises(shard_directory.ReadOnly) as raised:
        router.run("tenant", tenant, lambda conn: conn.execute(ORDER, (tenant, "late")))
    assert time.monotonic() - started >= 1.5, "it waited out the deadline (2 s)"
    e = raised.value
    assert (e.entity_id, e.retryable) == (tenant, True)
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []
    fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))


def test_a_read_while_migrating_reads_the_source_and_the_target(fleet, directory, router, tenant) -> None:
    router.run("tenant", tenant, lambda conn: conn.execute(ORDER, (tenant, "src")))
    version = fleet.sql(
        "directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,)
    )[0][0]
    assert directory.wait_for_version(version, timeout=10)
    count = "SELECT count(*) FROM orders WHERE tenant_id = %s"
    reads = router.read("tenant", tenant, lambda conn: conn.execute(count, (tenant,)).fetchone()[0])
    assert reads == Reads(source=1, target=0)
    assert reads.both and reads.merge(lambda a, b: a + b) == 1
    fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))
    assert directory.wait_for_version(version + 1, timeout=10)
    assert router.read("tenant", tenant, lambda c: 7) == Reads(source=7)


def test_a_shard_the_router_was_not_given_is_unknown_or_learned_from_the_registry(
    fleet, directory
) -> None:
    fleet.add_tenant("py-on-2", "shard_2")
    only_one = Router(directory, {"shard_1": fleet.shards["shard_1"]})
    with only_one, pytest.raises(shard_directory.UnknownShard) as raised:
        only_one.run("tenant", "py-on-2", lambda conn: None)
    assert (raised.value.shard, raised.value.entity_id) == ("shard_2", "py-on-2")
    with Router(directory, {}, learn_shards="user=postgres") as learning:
        learning.run("tenant", "py-on-2", lambda conn: conn.execute(ORDER, ("py-on-2", "x")))
    assert fleet.orders("shard_2", "py-on-2") == ["x"]


def test_a_stale_route_is_refused_by_the_shard_and_rerun_where_the_directory_says(
    fleet, tenant
) -> None:
    """A client told nothing after it cached the tenant: the tenant moves (a cutover fences the
    source), the old shard refuses the stale route with 40001 `moved` at the stamp, before the
    callable runs, and it runs once, on the new shard."""
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
        with Router(deaf, fleet.shards) as router:
            assert deaf.lookup("tenant", tenant).shard_name == "shard_1"
            fleet.cut_over(tenant)
            runs = []

            def order(conn: psycopg.Connection) -> None:
                runs.append(1)
                conn.execute(ORDER, (tenant, "moved"))

            router.run("tenant", tenant, order)
            assert fleet.orders("shard_2", tenant) == ["moved"]
            assert fleet.orders("shard_1", tenant) == []
            refused = deaf.stats()["rejections"]
            assert refused["moved"] == 1 and sum(refused.values()) == 1, refused
            assert runs == [1], "refused before the callable ran"
