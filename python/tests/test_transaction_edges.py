"""The routed transaction off its usual paths: BEGIN and the stamp pipelined on one pooled
connection reused across modes, refusals and failures at the stamp, at COMMIT and inside the
block, blocks that end the transaction themselves, interruptions mid-pipeline, bad entities,
the first poll of a wait with the GIL held, and ``attempts`` on the application's own
connections. Written by an attack on these changes; each test states the invariant it checks."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import threading
import time

import psycopg
import pytest
import sqlalchemy
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from sqlalchemy.orm import Session

import shard_directory
from shard_directory import AsyncRouter, AsyncShardDirectory, Router, ShardDirectory, _native

ORDER = "INSERT INTO orders (tenant_id, item) VALUES (%s, %s)"
RAISE_40001 = "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$"
SHOW = (
    "SELECT current_setting('transaction_read_only'), current_setting('transaction_isolation'),"
    " current_setting('app.directory_version', true)"
)
LEFTOVER = (
    "SELECT coalesce(current_setting('app.directory_version', true), ''),"
    " coalesce(current_setting('app.entity_id', true), ''),"
    " current_setting('statement_timeout'),"
    " current_setting('idle_in_transaction_session_timeout')"
)


def wait_until(condition, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _pool_check(pool) -> tuple:
    """The pooled connection as the next transaction would get it (sync pool)."""
    with pool.connection(timeout=5) as c:
        status = c.info.transaction_status
        internal = (c._num_transactions, c._pipeline is None)
        leftover = c.execute(LEFTOVER).fetchone()
    return status, internal, leftover


CLEAN = (TransactionStatus.IDLE, (0, True), ("", "", "0", "0"))


@pytest.fixture
def one(fleet, directory):
    """A router with ONE connection per shard: every transaction reuses it."""
    with Router(directory, fleet.shards, deadline=2.0, pool_size=1) as r:
        yield r


@pytest.fixture
def pool_warnings(caplog):
    """psycopg_pool's warnings (a connection returned in a transaction, or closed)."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    yield lambda: [
        r.getMessage() for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= 30
    ]


@contextlib.contextmanager
def stamps_blocked(fleet, shard: str):
    """Every stamp on ``shard`` waits: EXCLUSIVE on shard_settings, held by the superuser."""
    conn = psycopg.connect(fleet.shards[shard])
    try:
        conn.execute("LOCK TABLE shard_directory.shard_settings IN EXCLUSIVE MODE")
        yield conn
    finally:
        conn.rollback()
        conn.close()


def stamp_waiting(fleet, shard: str) -> bool:
    rows = fleet.sql(
        shard,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%%assert_directory_version%%' AND pid <> pg_backend_pid()",
    )
    return rows[0][0] > 0


def terminate(fleet, shard: str, pid: int) -> None:
    assert fleet.sql(shard, "SELECT pg_terminate_backend(%s, 5000)", (pid,))[0][0]


# --- 1. the pipelined stamp: pooled connection state ------------------------------------------


def test_one_pooled_connection_alternating_read_only_serializable_and_default(
    fleet, one, tenant, pool_warnings
) -> None:
    """read_only and isolation apply to their transaction only, the same connection reused by
    run, transaction and read in every order; outside a routed transaction nothing is left."""
    pool = one._pools["shard_1"]
    ser = IsolationLevel.SERIALIZABLE
    rr = IsolationLevel.REPEATABLE_READ
    plan = [
        ("run", False, None, ("off", "read committed")),
        ("run", True, None, ("on", "read committed")),
        ("run", False, ser, ("off", "serializable")),
        ("run", True, ser, ("on", "serializable")),
        ("tx", False, None, ("off", "read committed")),
        ("tx", True, rr, ("on", "repeatable read")),
        ("read", True, None, ("on", "read committed")),
        ("tx", False, ser, ("off", "serializable")),
        ("read", True, None, ("on", "read committed")),
        ("run", False, None, ("off", "read committed")),
    ]
    for i, (how, ro, iso, expected) in enumerate(plan * 2):
        if how == "run":
            got = one.run("tenant", tenant, lambda c: c.execute(SHOW).fetchone(), read_only=ro,
                          isolation=iso)
        elif how == "tx":
            with one.transaction("tenant", tenant, read_only=ro, isolation=iso) as c:
                got = c.execute(SHOW).fetchone()
        else:
            got = one.read("tenant", tenant, lambda c: c.execute(SHOW).fetchone()).source
        assert got[:2] == expected, (i, how, ro, iso, got)
        assert got[2] not in (None, ""), "stamped"
        if ro:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"ro{i}")),
                        read_only=True, isolation=iso)
        else:
            one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"w{i:02d}")),
                    isolation=iso)
        assert _pool_check(pool) == CLEAN
    written = [f"w{i:02d}" for i, p in enumerate(plan * 2) if not p[1]]
    assert fleet.orders("shard_1", tenant) == written
    assert pool_warnings() == []


def test_a_stamp_refused_again_and_again_leaves_the_one_connection_clean(
    fleet, one, tenant, pool_warnings
) -> None:
    """A refusal at the pipelined stamp (DirectoryBehind, at once) ten times over on one pooled
    connection (past psycopg's prepare threshold), then the fence lifted: the write commits
    once, the connection clean."""
    pool = one._pools["shard_1"]
    fleet.sql("shard_1", "SELECT shard_directory.fence_owned('tenant', %s, 1000000000)", (tenant,))
    try:
        for i in range(10):
            with pytest.raises(shard_directory.DirectoryBehind):
                one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"no{i}")))
            assert _pool_check(pool) == CLEAN
    finally:
        fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)", (tenant,))
    for i in range(7):
        one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"yes{i}")))
    assert fleet.orders("shard_1", tenant) == [f"yes{i}" for i in range(7)]
    assert _pool_check(pool) == CLEAN
    assert pool_warnings() == []


def test_stale_refusals_interleaved_with_commits_on_one_prepared_connection(
    fleet, tenant, pool_warnings
) -> None:
    """A deaf client; before each write the shard's min_accepted is raised past the version it
    knows: each write's first stamp is refused (stale), the directory re-read, the write re-run
    and committed once -- on one connection, with prepared statements (the default)."""
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
        with Router(deaf, fleet.shards, deadline=5.0, pool_size=1) as router:
            router.run("tenant", tenant, lambda c: None)  # cached at the version it knows
            for i in range(8):
                fleet.add_tenant(f"{tenant}-bump{i}", "shard_2")
                current = fleet.sql("directory", "SELECT shard_directory.current_version()")[0][0]
                fleet.sql("shard_1", "SELECT shard_directory.raise_min_accepted(%s)", (current,))
                router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"s{i}")))
                assert _pool_check(router._pools["shard_1"]) == CLEAN
            assert deaf.stats()["rejections"]["stale"] == 8
    assert fleet.orders("shard_1", tenant) == [f"s{i}" for i in range(8)]
    assert pool_warnings() == []


def test_a_stamp_error_that_is_not_a_refusal_leaves_the_pool_usable(fleet, directory, tenant,
                                                                    pool_warnings) -> None:
    """A shard role without USAGE on the extension's schema: the stamp fails (42501), raised as
    it is, each time, on one pooled connection that stays usable and clean."""
    role = "attack45_nopriv"
    try:
        fleet.sql("shard_1", f"CREATE ROLE {role} LOGIN")
    except psycopg.errors.DuplicateObject:
        pass
    fleet.sql("shard_1", f"GRANT SELECT, INSERT ON orders TO {role}")
    shards = dict(fleet.shards, shard_1=make_conninfo(fleet.shards["shard_1"], user=role))
    with Router(directory, shards, deadline=2.0, pool_size=1) as router:
        for i in range(7):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"x{i}")))
            assert _pool_check(router._pools["shard_1"]) == CLEAN
        fleet.sql("shard_1", f"GRANT USAGE ON SCHEMA shard_directory TO {role}")
        try:
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "granted")))
        finally:
            fleet.sql("shard_1", f"REVOKE USAGE ON SCHEMA shard_directory FROM {role}")
        assert _pool_check(router._pools["shard_1"]) == CLEAN
    assert fleet.orders("shard_1", tenant) == ["granted"]
    assert pool_warnings() == []


@pytest.mark.parametrize("how", ["run", "transaction", "read"])
def test_a_terminated_pooled_connection_is_replaced_without_a_sleep(
    fleet, one, tenant, how
) -> None:
    """The backend of the one pooled connection is terminated (and gone: the wait of
    pg_terminate_backend) between two transactions: the next one runs on a new connection."""
    pid = one.run("tenant", tenant, lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])
    terminate(fleet, "shard_1", pid)
    if how == "run":
        one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "after")))
    elif how == "transaction":
        with one.transaction("tenant", tenant) as c:
            c.execute(ORDER, (tenant, "after"))
    else:
        assert one.read("tenant", tenant, lambda c: 1).source == 1
        one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "after")))
    assert fleet.orders("shard_1", tenant) == ["after"]
    assert _pool_check(one._pools["shard_1"]) == CLEAN


def test_a_statement_timeout_leaves_nothing_committed_and_nothing_set(
    fleet, directory, tenant, pool_warnings
) -> None:
    """attempt_timeout bounds the block's statements (57014); the next transaction on the same
    connection is stamped afresh, and outside one statement_timeout is back to 0."""
    with Router(directory, fleet.shards, deadline=2.0, attempt_timeout=0.5, pool_size=1) as r:
        def slow(c):
            c.execute(ORDER, (tenant, "slow"))
            c.execute("SELECT pg_sleep(3)")

        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            r.run("tenant", tenant, slow)
        assert time.monotonic() - started < 2.0
        assert _pool_check(r._pools["shard_1"]) == CLEAN
        r.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "fast")))
        assert _pool_check(r._pools["shard_1"]) == CLEAN
    assert fleet.orders("shard_1", tenant) == ["fast"]
    assert pool_warnings() == []


def test_an_error_caught_in_the_block_is_aborted_and_the_connection_clean(
    fleet, one, tenant, pool_warnings
) -> None:
    def swallow(c):
        c.execute(ORDER, (tenant, "kept"))
        try:
            c.execute("SELECT 1/0")
        except psycopg.errors.DivisionByZero:
            pass
        return "done"

    for _ in range(3):
        with pytest.raises(shard_directory.Aborted):
            one.run("tenant", tenant, swallow)
        assert _pool_check(one._pools["shard_1"]) == CLEAN
    assert fleet.orders("shard_1", tenant) == []
    assert pool_warnings() == []


# --- 2. what the application does to the transaction inside the block -------------------------


def test_a_nested_transaction_is_a_savepoint_inside_the_stamped_one(fleet, one, tenant) -> None:
    """A savepoint rolled back keeps the stamp (taken before it) and the outer write; the
    transaction commits once."""
    with one.transaction("tenant", tenant) as c:
        c.execute(ORDER, (tenant, "outer"))
        with pytest.raises(psycopg.errors.DivisionByZero):
            with c.transaction():
                c.execute(ORDER, (tenant, "inner-rolled-back"))
                c.execute("SELECT 1/0")
        with c.transaction():
            c.execute(ORDER, (tenant, "inner-kept"))
        assert c.execute(SHOW).fetchone()[2] not in (None, "")

    def nested(c):
        with c.transaction() as sp:
            c.execute(ORDER, (tenant, "rolled"))
            raise psycopg.Rollback(sp)
        c.execute(ORDER, (tenant, "run-kept"))

    one.run("tenant", tenant, nested)
    assert fleet.orders("shard_1", tenant) == ["inner-kept", "outer", "run-kept"]
    assert _pool_check(one._pools["shard_1"]) == CLEAN


@pytest.mark.parametrize("method", ["commit", "rollback"])
def test_an_explicit_commit_or_rollback_in_the_block_is_refused_and_nothing_committed(
    fleet, one, tenant, method
) -> None:
    def explicit(c):
        c.execute(ORDER, (tenant, "before"))
        getattr(c, method)()
        c.execute(ORDER, (tenant, "after"))

    with pytest.raises(psycopg.ProgrammingError):
        one.run("tenant", tenant, explicit)
    assert fleet.orders("shard_1", tenant) == []
    assert _pool_check(one._pools["shard_1"]) == CLEAN


def test_a_psycopg_rollback_raised_by_run_s_function_does_not_rerun_it(fleet, one, tenant) -> None:
    """``raise psycopg.Rollback`` in fn: psycopg's way to leave a transaction block rolled back.
    The router's transaction swallows it, so run()'s loop goes on to another attempt and calls
    fn again (it would for ever)."""
    calls = []

    class Stop(Exception):
        pass

    def fn(c):
        calls.append(1)
        if len(calls) > 3:
            raise Stop
        c.execute(ORDER, (tenant, f"rb{len(calls)}"))
        raise psycopg.Rollback()

    try:
        one.run("tenant", tenant, fn)
    except (Stop, psycopg.Error, shard_directory.ShardDirectoryError):
        pass
    assert fleet.orders("shard_1", tenant) == []
    assert calls == [1], f"fn was called {len(calls)} times for one run()"


def test_a_commit_statement_inside_run_is_not_acknowledged_as_one_stamped_transaction(
    fleet, one, tenant
) -> None:
    """fn sends COMMIT itself: the stamped transaction ends there, the rest of fn runs on an
    autocommit connection, unstamped and outside READ ONLY. The router should not acknowledge
    that as its transaction (it checks INERROR only; IDLE at the end passes)."""
    def fn(c):
        c.execute(ORDER, (tenant, "stamped"))
        c.execute("COMMIT")
        return c.execute(SHOW).fetchone()

    try:
        after = one.run("tenant", tenant, fn)
    except (psycopg.Error, shard_directory.ShardDirectoryError):
        after = None
    assert after is None, (
        f"run() acknowledged; after the COMMIT fn ran read_only={after[0]}, "
        f"stamp={after[2]!r}"
    )


def test_a_lost_connection_caught_in_run_is_not_acknowledged(fleet, one, tenant) -> None:
    """fn writes, its backend is terminated, fn catches the OperationalError and returns. The
    write was never committed; run() must not return fn's value as if it were (the INERROR check
    misses a connection that is gone: its status is UNKNOWN)."""
    def fn(c):
        c.execute(ORDER, (tenant, "lost"))
        terminate(fleet, "shard_1", c.info.backend_pid)
        try:
            c.execute("SELECT 1")
        except psycopg.OperationalError:
            pass
        return "ok"

    try:
        result = one.run("tenant", tenant, fn)
    except (psycopg.Error, shard_directory.ShardDirectoryError):
        result = None
    committed = fleet.orders("shard_1", tenant)
    assert result is None or committed == ["lost"], (
        f"run() returned {result!r} (acknowledged) but the shard has {committed}"
    )


# --- 3. interrupted in the middle of the pipelined BEGIN + stamp ------------------------------


def test_keyboard_interrupt_while_the_pipelined_stamp_waits_leaves_nothing_and_a_clean_pool(
    fleet, one, tenant, pool_warnings
) -> None:
    """Ctrl-C (a SIGALRM handler raising KeyboardInterrupt) while BEGIN+stamp wait on the
    shard: KeyboardInterrupt reaches the caller (not another error), nothing is committed, and
    the one pooled connection serves the next transaction."""
    one.run("tenant", tenant, lambda c: None)  # the connection exists
    def handler(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, handler)
    main = threading.main_thread().ident
    raised: list[BaseException] = []
    try:
        with stamps_blocked(fleet, "shard_1"):
            def poke():
                wait_until(lambda: stamp_waiting(fleet, "shard_1"), what="the stamp waiting")
                signal.pthread_kill(main, signal.SIGALRM)

            t = threading.Thread(target=poke)
            t.start()
            started = time.monotonic()
            try:
                one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "interrupted")))
            except BaseException as e:  # noqa: BLE001
                raised.append(e)
            elapsed = time.monotonic() - started
            t.join()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert raised and isinstance(raised[0], KeyboardInterrupt), repr(raised)
    assert elapsed < 5.0
    one.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "after")))
    assert fleet.orders("shard_1", tenant) == ["after"]
    assert _pool_check(one._pools["shard_1"]) == CLEAN


async def _apool_check(pool) -> tuple:
    async with pool.connection(timeout=5) as c:
        status = c.info.transaction_status
        internal = (c._num_transactions, c._pipeline is None)
        leftover = await (await c.execute(LEFTOVER)).fetchone()
    return status, internal, leftover


@pytest.mark.parametrize("where", ["run", "transaction", "read"])
def test_cancelling_a_task_while_its_pipelined_stamp_waits(fleet, tenant, where) -> None:
    """asyncio: a task cancelled while BEGIN+stamp wait on the shard ends cancelled (a
    CancelledError, not a psycopg error), promptly (the lock still held), nothing committed;
    the one pooled connection then serves the next transaction, clean."""
    outcome: dict[str, object] = {}

    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards, pool_size=1, deadline=5.0) as router:
                async def noop(c):
                    return None

                await router.run("tenant", tenant, noop)

                async def order(c):
                    await c.execute(ORDER, (tenant, "cancelled"))

                async def job():
                    if where == "run":
                        await router.run("tenant", tenant, order)
                    elif where == "transaction":
                        async with router.transaction("tenant", tenant) as c:
                            await order(c)
                    else:
                        await router.read("tenant", tenant, order)

                with stamps_blocked(fleet, "shard_1"):
                    task = asyncio.create_task(job())
                    deadline = time.monotonic() + 10
                    while not await asyncio.to_thread(stamp_waiting, fleet, "shard_1"):
                        assert time.monotonic() < deadline, "the stamp never waited"
                        await asyncio.sleep(0.01)
                    task.cancel()
                    done, _ = await asyncio.wait({task}, timeout=3.0)
                    outcome["prompt"] = bool(done)
                if not done:
                    await asyncio.wait({task}, timeout=10.0)
                try:
                    task.result()
                    outcome["result"] = "returned"
                except BaseException as e:  # noqa: BLE001
                    outcome["result"] = e

                async def after(c):
                    await c.execute(ORDER, (tenant, "after"))

                await asyncio.wait_for(router.run("tenant", tenant, after), 10)
                outcome["pool"] = await _apool_check(router._pools["shard_1"])

    asyncio.run(main())
    assert isinstance(outcome["result"], asyncio.CancelledError), repr(outcome["result"])
    assert outcome["prompt"], "the cancelled task waited for the lock"
    assert fleet.orders("shard_1", tenant) == ["after"]
    assert outcome["pool"] == CLEAN


def test_async_one_connection_alternating_modes_errors_and_a_terminated_backend(
    fleet, tenant
) -> None:
    """AsyncRouter, pool_size=1: read-only / serializable / default alternate, an Aborted, a
    refusal at the stamp, a statement timeout and a terminated backend in between; each
    transaction sees its own settings and the connection is clean after each."""
    got: list = []

    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards, pool_size=1, deadline=2.0,
                                   attempt_timeout=1.0) as router:
                pool = router._pools["shard_1"]

                async def show(c):
                    return await (await c.execute(SHOW)).fetchone()

                async def write(item):
                    async def w(c):
                        await c.execute(ORDER, (tenant, item))
                    return w

                async def swallow(c):
                    await c.execute(ORDER, (tenant, "swallowed"))
                    try:
                        await c.execute("SELECT 1/0")
                    except psycopg.errors.DivisionByZero:
                        pass

                async def slow(c):
                    await c.execute(ORDER, (tenant, "slow"))
                    await c.execute("SELECT pg_sleep(3)")

                async def pid(c):
                    return (await (await c.execute("SELECT pg_backend_pid()")).fetchone())[0]

                for rnd in range(2):
                    got.append(("ro", (await router.run("tenant", tenant, show, read_only=True))[:2]))
                    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                        await router.run("tenant", tenant, await write("ro"), read_only=True)
                    got.append(("ser", (await router.run(
                        "tenant", tenant, show, isolation=IsolationLevel.SERIALIZABLE))[:2]))
                    await router.run("tenant", tenant, await write(f"a{rnd}"))
                    with pytest.raises(shard_directory.Aborted):
                        await router.run("tenant", tenant, swallow)
                    assert await _apool_check(pool) == CLEAN
                    with pytest.raises(psycopg.errors.QueryCanceled):
                        await router.run("tenant", tenant, slow)
                    assert await _apool_check(pool) == CLEAN
                    fleet.sql("shard_1",
                              "SELECT shard_directory.fence_owned('tenant', %s, 1000000000)",
                              (tenant,))
                    try:
                        with pytest.raises(shard_directory.DirectoryBehind):
                            await router.run("tenant", tenant, await write("behind"))
                    finally:
                        fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)",
                                  (tenant,))
                    assert await _apool_check(pool) == CLEAN
                    terminate(fleet, "shard_1", await router.run("tenant", tenant, pid))
                    await router.run("tenant", tenant, await write(f"b{rnd}"))
                    got.append(("def", (await router.run("tenant", tenant, show))[:2]))
                    assert await _apool_check(pool) == CLEAN

    asyncio.run(main())
    assert got == [
        ("ro", ("on", "read committed")),
        ("ser", ("off", "serializable")),
        ("def", ("off", "read committed")),
    ] * 2
    assert fleet.orders("shard_1", tenant) == ["a0", "a1", "b0", "b1"]


# --- 4. a refusal raised at COMMIT ------------------------------------------------------------


@pytest.fixture(scope="module")
def at_commit(fleet):
    """``attack45_marks``: a deferred constraint trigger raises 40001 at COMMIT when the
    transaction set ``attack45.refuse``."""
    for shard in fleet.shards:
        fleet.sql(shard, "CREATE TABLE IF NOT EXISTS attack45_marks (tenant_id text)")
        fleet.sql(
            shard,
            "CREATE OR REPLACE FUNCTION attack45_refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF current_setting('attack45.refuse', true) = 'on' THEN"
            " RAISE EXCEPTION 'could not serialize at commit' USING ERRCODE = '40001'; END IF;"
            " RETURN NULL; END $$",
        )
        fleet.sql(shard, "DROP TRIGGER IF EXISTS attack45_at_commit ON attack45_marks")
        fleet.sql(
            shard,
            "CREATE CONSTRAINT TRIGGER attack45_at_commit AFTER INSERT ON attack45_marks "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION attack45_refuse()",
        )
    return "INSERT INTO attack45_marks VALUES (%s)"


def test_router_run_refused_at_commit_is_rerun_and_committed_once(
    fleet, one, tenant, at_commit
) -> None:
    calls = []

    def fn(c):
        calls.append(1)
        c.execute(ORDER, (tenant, f"c{len(calls)}"))
        c.execute(at_commit, (tenant,))
        if len(calls) == 1:
            c.execute("SET LOCAL attack45.refuse = 'on'")

    one.run("tenant", tenant, fn)
    assert calls == [1, 1]
    assert fleet.orders("shard_1", tenant) == ["c2"]
    assert _pool_check(one._pools["shard_1"]) == CLEAN


def test_async_router_run_refused_at_commit_is_rerun_and_committed_once(
    fleet, tenant, at_commit
) -> None:
    calls = []

    async def main():
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards, pool_size=1, deadline=3.0) as router:
                async def fn(c):
                    calls.append(1)
                    await c.execute(ORDER, (tenant, f"c{len(calls)}"))
                    await c.execute(at_commit, (tenant,))
                    if len(calls) == 1:
                        await c.execute("SET LOCAL attack45.refuse = 'on'")

                await router.run("tenant", tenant, fn)
                return await _apool_check(router._pools["shard_1"])

    assert asyncio.run(main()) == CLEAN
    assert calls == [1, 1]
    assert fleet.orders("shard_1", tenant) == ["c2"]


# --- 5. attempts ------------------------------------------------------------------------------


def test_attempts_plain_connection_refused_at_commit_commits_once(
    fleet, directory, tenant, at_commit
) -> None:
    numbers = []
    with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
        for attempt in directory.attempts("tenant", tenant, deadline=3.0):
            numbers.append(attempt.number)
            with attempt, conn.transaction():
                conn.execute(*attempt.stamp)
                conn.execute(ORDER, (tenant, f"p{attempt.number}"))
                conn.execute(at_commit, (tenant,))
                if attempt.number == 1:
                    conn.execute("SET LOCAL attack45.refuse = 'on'")
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert numbers == [1, 2]
    assert fleet.orders("shard_1", tenant) == ["p2"]


def test_attempts_sqlalchemy_refused_at_commit_commits_once(
    fleet, directory, engines, tenant, at_commit
) -> None:
    numbers = []
    for attempt in directory.attempts("tenant", tenant, deadline=3.0):
        numbers.append(attempt.number)
        with attempt, Session(engines[attempt.shard]) as session, session.begin():
            conn = session.connection()
            conn.exec_driver_sql(*attempt.stamp)
            conn.exec_driver_sql(ORDER, (tenant, f"s{attempt.number}"))
            conn.exec_driver_sql(at_commit, (tenant,))
            if attempt.number == 1:
                conn.exec_driver_sql("SET LOCAL attack45.refuse = 'on'")
    assert numbers == [1, 2]
    assert fleet.orders("shard_1", tenant) == ["s2"]


def test_attempts_sqlalchemy_refusal_in_an_autoflush(fleet, directory, engines, tenant) -> None:
    """A refusal raised by an ORM autoflush, after the stamp passed: the flushed row's entity
    (another tenant on the same shard) is fenced frozen there. The row trigger refuses it
    (40001 `frozen`) inside session.execute's autoflush, wrapped by SQLAlchemy; it is learned
    from (a backoff), the fence is lifted between attempts, and the second commits once."""
    from test_attempts import Order  # the README's model

    other = f"{tenant}-frozen-row"
    fleet.add_tenant(other, "shard_1")
    fleet.sql("shard_1", "SELECT shard_directory.fence_frozen('tenant', %s)", (other,))
    numbers = []
    try:
        for attempt in directory.attempts("tenant", tenant, deadline=5.0):
            numbers.append(attempt.number)
            if attempt.number == 2:
                fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)", (other,))
            with attempt, Session(engines[attempt.shard]) as session, session.begin():
                session.connection().exec_driver_sql(*attempt.stamp)
                session.add(Order(tenant_id=other, item="flushed"))
                session.execute(sqlalchemy.select(Order).where(Order.tenant_id == other)).all()
    finally:
        fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)", (other,))
    assert numbers == [1, 2]
    assert fleet.orders("shard_1", other) == ["flushed"]
    assert directory.stats()["rejections"]["frozen"] >= 1


def test_an_attempts_object_reused_after_it_completed_does_not_silently_skip_the_work(
    fleet, directory, tenant
) -> None:
    """An Attempts kept and iterated again (a helper that stores it, a retry decorator): the
    second loop's body never runs and no error says so -- the second write is silently lost."""
    attempts = directory.attempts("tenant", tenant)
    with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
        for item in ("first", "second"):
            ran = False
            try:
                for attempt in attempts:
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
                        conn.execute(ORDER, (tenant, item))
                        ran = True
            except (RuntimeError, shard_directory.ShardDirectoryError):
                ran = None  # refused loudly: fine
            if item == "second":
                assert ran is not False, "the loop ended at once: the write was skipped, silently"
    assert fleet.orders("shard_1", tenant) in (["first"], ["first", "second"])


def test_attempts_restricted_to_shards_never_yields_a_shard_outside_them(fleet, tenant) -> None:
    """shards={"shard_1"}: the application reaches shard_1 only. The tenant moved to shard_2:
    the loop should end with UnknownShard (as Router does), not hand an attempt on a shard the
    application said it cannot reach."""
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
        assert deaf.lookup("tenant", tenant).shard_name == "shard_1"
        fleet.cut_over(tenant)
        yielded = []
        with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
            try:
                for attempt in deaf.attempts("tenant", tenant, shards={"shard_1"}, deadline=2.0):
                    yielded.append(attempt.shard)
                    if attempt.shard != "shard_1":
                        break
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
                        conn.execute(ORDER, (tenant, "x"))
            except shard_directory.ShardDirectoryError:
                pass
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []
    assert yielded and all(s == "shard_1" for s in yielded), yielded


def test_attempts_on_a_frozen_tenant_reads_pass_at_once_writes_wait_out_the_deadline(
    fleet, directory, tenant
) -> None:
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    version = fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))[0][0]
    fleet.sql("shard_1", "SELECT shard_directory.fence_frozen('tenant', %s)", (tenant,))
    try:
        assert directory.wait_for_version(version, timeout=10)
        with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
            started = time.monotonic()
            for checked in (True, False):
                for attempt in directory.attempts("tenant", tenant, read_only=True,
                                                  checked=checked):
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
                        n = conn.execute("SELECT count(*) FROM orders WHERE tenant_id = %s",
                                         (tenant,)).fetchone()[0]
                assert n == 0 and attempt.number == 1
            assert time.monotonic() - started < 0.5
            bodies = 0
            started = time.monotonic()
            with pytest.raises(shard_directory.ReadOnly):
                for attempt in directory.attempts("tenant", tenant, deadline=1.0):
                    bodies += 1
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
                        conn.execute(ORDER, (tenant, "late"))
            elapsed = time.monotonic() - started
            assert bodies == 0 and 0.5 <= elapsed < 3.0, (bodies, elapsed)
            # a write in a read-only attempt is still checked as a write by the shard
            with pytest.raises(shard_directory.Rejected):
                for attempt in directory.attempts("tenant", tenant, read_only=True, deadline=1.0):
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
                        conn.execute(ORDER, (tenant, "sneaky"))
    finally:
        fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)", (tenant,))
        fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []


def test_attempts_refused_until_the_deadline_end_rejected_in_time(fleet, directory, tenant) -> None:
    numbers = []
    started = time.monotonic()
    with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
        with pytest.raises(shard_directory.Rejected) as raised:
            for attempt in directory.attempts("tenant", tenant, deadline=1.0):
                numbers.append(attempt.number)
                with attempt, conn.transaction():
                    conn.execute(*attempt.stamp)
                    conn.execute(ORDER, (tenant, "never"))
                    conn.execute(RAISE_40001)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3.0, elapsed
    assert len(numbers) >= 2 and numbers == list(range(1, len(numbers) + 1))
    assert isinstance(raised.value.__cause__, psycopg.errors.SerializationFailure)
    assert fleet.orders("shard_1", tenant) == []


def test_attempts_stamp_params_and_sql(directory, tenant) -> None:
    attempt = next(iter(directory.attempts("tenant", tenant, read_only=True, checked=False)))
    sql, params = attempt.stamp
    assert "assert_directory_version" not in sql
    assert set(params) == {"version", "entity_type", "entity_id", "left"}
    assert params["entity_type"] == "tenant" and params["entity_id"] == tenant
    assert int(params["version"]) == directory.version
    assert 0 < int(params["left"]) <= 15000
    with attempt:
        pass


# --- 6. the native entity check ---------------------------------------------------------------


class _Str(str):
    pass


class _StrWithStr(str):
    def __str__(self) -> str:
        return "not-the-value"


class _Int(int):
    pass


class _IntWithStr(int):
    def __str__(self) -> str:
        return "E.A"


class _Color(int, enum.Enum):
    RED = 7


BAD = [
    ("tenant", True, TypeError),
    ("tenant", False, TypeError),
    ("tenant", None, TypeError),
    ("tenant", b"py1", TypeError),
    ("tenant", bytearray(b"py1"), TypeError),
    ("tenant", 1.0, TypeError),
    ("tenant", ["py1"], TypeError),
    (b"tenant", "py1", TypeError),
    (None, "py1", TypeError),
    (1, "py1", TypeError),
    ("tenant", "py\x001", ValueError),
    ("ten\x00ant", "py1", ValueError),
    ("tenant", "\ud800", ValueError),
    ("\udfff", "py1", ValueError),
    ("tenant", 10**5000, ValueError),
]


class _IntNul(int):
    def __str__(self) -> str:
        return "1\x002"


class _IntBadStr(int):
    def __str__(self):  # type: ignore[override]
        return 12


def test_an_int_subclass_whose_str_is_odd_is_keyed_by_its_number() -> None:
    assert _native.entity("tenant", _IntNul(12)) == ("tenant", "12")
    assert _native.entity("tenant", _IntBadStr(12)) == ("tenant", "12")


def _calls(directory, router):
    return {
        "entity": lambda t, i: _native.entity(t, i),
        "lookup": lambda t, i: directory.lookup(t, i),
        "lookup_cached": lambda t, i: directory._native.lookup_cached(t, i),
        "native_lookup": lambda t, i: directory._native.lookup(t, i),
        "routing": lambda t, i: directory._native.routing(
            t, i, write=True, deadline=1.0, attempt_timeout=1.0, base_backoff=0.01,
            max_backoff=0.1),
        "attempts": lambda t, i: directory.attempts(t, i),
        "run": lambda t, i: router.run(t, i, lambda c: c.execute(ORDER, ("py1", "bad"))),
        "read": lambda t, i: router.read(t, i, lambda c: 1),
        "transaction": lambda t, i: router.transaction(t, i).__enter__(),
    }


def _id(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and type(v) is int and v > 10**100:
        return "huge-int"
    try:
        return f"{type(v).__name__}:{v!r}"[:30]
    except Exception:  # noqa: BLE001
        return type(v).__name__


@pytest.mark.parametrize("entity_type,entity_id,error", BAD, ids=_id)
def test_a_bad_entity_is_refused_by_every_call_before_anything_is_asked(
    fleet, directory, router, entity_type, entity_id, error
) -> None:
    before = directory.stats()
    for name, call in _calls(directory, router).items():
        with pytest.raises(error):
            call(entity_type, entity_id)
    after = directory.stats()
    for counter in ("cache_misses", "store_queries", "cache_hits"):
        assert after[counter] == before[counter], (counter, before[counter], after[counter])


@pytest.mark.parametrize(
    "make",
    [_Str, _Int, lambda v: v],
    ids=["str-subclass", "int-subclass", "plain"],
)
def test_subclasses_of_str_and_int_are_keyed_by_their_value(fleet, directory, router, make) -> None:
    name = str(700000 + time.monotonic_ns() % 100000)
    fleet.add_tenant(name, "shard_2")
    value = make(name) if make is not _Int else _Int(int(name))
    assert directory.lookup("tenant", value).shard_name == "shard_2"
    assert _native.entity("tenant", value) == ("tenant", name)
    assert type(_native.entity("tenant", value)[1]) is str

    def order(c):
        c.execute(ORDER, (name, "sub"))
        return c.execute("SELECT current_setting('app.entity_id')").fetchone()[0]

    assert router.run("tenant", value, order) == name
    attempt = next(iter(directory.attempts("tenant", value)))
    assert attempt.stamp[1]["entity_id"] == name and type(attempt.stamp[1]["entity_id"]) is str
    with attempt:
        pass
    assert fleet.orders("shard_2", name) == ["sub"]


def test_an_int_enum_like_id_is_keyed_by_its_number(fleet, directory) -> None:
    """The docs: an int id is its decimal text (8842 is "8842"). An int subclass that prints
    otherwise (an ``int, Enum`` mix: str() is "_Color.RED") is keyed by that text, not its
    number -- a different entity than the int the caller holds (7 == _Color.RED)."""
    assert _Color.RED == 7
    assert _native.entity("tenant", _Color.RED) == ("tenant", "7"), _native.entity(
        "tenant", _Color.RED
    )


def test_a_str_subclass_overriding_str_is_keyed_by_its_value(directory) -> None:
    assert _native.entity("tenant", _StrWithStr("abc")) == ("tenant", "abc")
    assert _native.entity(_StrWithStr("tenant"), "abc") == ("tenant", "abc")


def test_async_lookup_refuses_bad_entities_before_a_thread_is_used(fleet) -> None:
    async def main():
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            for t, i, error in BAD:
                with pytest.raises(error):
                    await d.lookup(t, i)

    asyncio.run(main())


# --- 7. wait.rs: the first poll with the GIL held ---------------------------------------------


def test_ctrl_c_during_a_lookup_that_reads_an_unanswering_directory(fleet) -> None:
    """A lookup miss whose first poll sends the query (GIL held), then waits on a directory
    that never answers: Ctrl-C ends it within the signal tick, not at the query timeout."""
    from test_edges import _Proxy

    c = conninfo_to_dict(fleet.directory)
    proxy = _Proxy(c.get("host") or "127.0.0.1", int(c["port"]))
    name = f"w{time.monotonic_ns()}"
    fleet.add_tenant(name, "shard_1")
    fleet.add_tenant(name + "b", "shard_1")
    conninfo = make_conninfo(fleet.directory, host="127.0.0.1", port=proxy.port)

    def handler(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, handler)
    d = ShardDirectory(conninfo, listen=False, poll_interval=3600.0, query_timeout=8.0)
    try:
        assert d.lookup("tenant", name).shard_name == "shard_1"
        proxy.hole = True
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            d.lookup("tenant", name + "b")
        assert time.monotonic() - started < 1.5
        # the cached entry still answers at once, the GIL held
        assert d.lookup("tenant", name).shard_name == "shard_1"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        proxy.close()
        d.close()


def test_wait_for_version_with_a_zero_timeout(directory) -> None:
    known = directory.version
    assert directory.wait_for_version(known, 0.0) is True
    started = time.monotonic()
    assert directory.wait_for_version(known + 10**9, 0.0) is False
    assert time.monotonic() - started < 0.5


def test_threads_and_an_event_loop_waiting_on_one_client_do_not_deadlock(fleet, tenant) -> None:
    """Sync lookups that miss (first poll under the GIL), sync runs re-run after a refusal
    (a backoff wait), and an event loop whose decisions are answered on the runtime's threads
    (which take the GIL to call back) -- all on one client, at once. Nothing hangs."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    errors: list[str] = []
    stop = time.monotonic() + 3.0
    others = [f"{tenant}-{i}" for i in range(4)]
    for t in others:
        fleet.add_tenant(t, "shard_2")
    try:
        with ShardDirectory(fleet.directory) as d, Router(d, fleet.shards, deadline=5.0) as r:
            def misses(i: int) -> None:
                n = 0
                while time.monotonic() < stop:
                    n += 1
                    try:
                        d.lookup("tenant", f"missing-{i}-{n}")
                    except shard_directory.UnknownEntity:
                        pass
                    except Exception as e:  # noqa: BLE001
                        errors.append(repr(e))

            def refused(i: int) -> None:
                n = 0
                while time.monotonic() < stop:
                    n += 1
                    calls = []

                    def fn(c):
                        calls.append(1)
                        if len(calls) == 1:
                            c.execute(RAISE_40001)
                        c.execute(ORDER, (others[i], f"r{n}"))

                    try:
                        r.run("tenant", others[i], fn)
                    except Exception as e:  # noqa: BLE001
                        errors.append(repr(e))

            def loop() -> None:
                async def main():
                    a = AsyncShardDirectory(d._native)
                    async with AsyncRouter(a, fleet.shards, deadline=5.0) as ar:
                        async def one(k):
                            async def fn(c):
                                await c.execute(ORDER, (tenant, f"a{k}"))
                            await ar.run("tenant", tenant, fn)
                        k = 0
                        while time.monotonic() < stop:
                            await asyncio.gather(*(one(k + j) for j in range(8)))
                            k += 8
                        return k

                try:
                    done["async"] = asyncio.run(main())
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))

            done: dict[str, int] = {}
            threads = [threading.Thread(target=misses, args=(i,)) for i in range(4)]
            threads += [threading.Thread(target=refused, args=(i,)) for i in range(4)]
            threads.append(threading.Thread(target=loop))
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads), "a thread hung"
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert errors == [], errors[:5]
    assert done.get("async", 0) > 0
    assert len(fleet.orders("shard_1", tenant)) == done["async"]


# --- 8. more of the same, for the other entry points ------------------------------------------


@pytest.mark.parametrize("how", ["transaction", "read"])
def test_a_moved_refusal_at_the_pipelined_stamp_reruns_transaction_and_read(
    fleet, tenant, how, pool_warnings
) -> None:
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
        with Router(deaf, fleet.shards, deadline=3.0, pool_size=1) as router:
            assert deaf.lookup("tenant", tenant).shard_name == "shard_1"
            fleet.cut_over(tenant)
            if how == "transaction":
                with router.transaction("tenant", tenant) as c:
                    c.execute(ORDER, (tenant, "moved"))
            else:
                reads = router.read("tenant", tenant, lambda c: c.execute(SHOW).fetchone())
                assert reads.source[0] == "on"
                router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "moved")))
            assert deaf.stats()["rejections"]["moved"] == 1
            for shard in ("shard_1", "shard_2"):
                assert _pool_check(router._pools[shard]) == CLEAN
    assert fleet.orders("shard_2", tenant) == ["moved"]
    assert fleet.orders("shard_1", tenant) == []
    assert pool_warnings() == []


def test_async_moved_refusal_at_the_pipelined_stamp(fleet, tenant) -> None:
    async def main():
        d = AsyncShardDirectory(
            await asyncio.to_thread(_native.Directory, fleet.directory, listen=False,
                                    poll_interval=3600.0)
        )
        async with d:
            async with AsyncRouter(d, fleet.shards, deadline=3.0, pool_size=1) as router:
                assert (await d.lookup("tenant", tenant)).shard_name == "shard_1"
                fleet.cut_over(tenant)

                async def order(c):
                    await c.execute(ORDER, (tenant, "moved"))

                async with router.transaction("tenant", tenant) as c:
                    await order(c)

                async def show(c):
                    return await (await c.execute(SHOW)).fetchone()

                assert (await router.read("tenant", tenant, show)).source[0] == "on"
                assert d.stats()["rejections"]["moved"] == 1
                return [await _apool_check(router._pools[s]) for s in ("shard_1", "shard_2")]

    assert asyncio.run(main()) == [CLEAN, CLEAN]
    assert fleet.orders("shard_2", tenant) == ["moved"]
    assert fleet.orders("shard_1", tenant) == []


def test_async_psycopg_rollback_raised_by_run_s_function_does_not_rerun_it(fleet, tenant) -> None:
    calls = []

    class Stop(Exception):
        pass

    async def main():
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards, deadline=2.0, pool_size=1) as router:
                async def fn(c):
                    calls.append(1)
                    if len(calls) > 3:
                        raise Stop
                    await c.execute(ORDER, (tenant, f"rb{len(calls)}"))
                    raise psycopg.Rollback()

                with contextlib.suppress(Stop, psycopg.Error, shard_directory.ShardDirectoryError):
                    await router.run("tenant", tenant, fn)

    asyncio.run(main())
    assert fleet.orders("shard_1", tenant) == []
    assert calls == [1], f"fn was called {len(calls)} times for one run()"


def test_the_async_directory_has_attempts_as_the_sync_one(fleet) -> None:
    """API parity: ``AsyncShardDirectory`` is "ShardDirectory for asyncio"; ``attempts`` (for
    SQLAlchemy's AsyncSession, say) exists only on the sync client, whose ``next()`` waits out
    a freeze blocking the calling thread (the event loop)."""
    assert hasattr(AsyncShardDirectory, "attempts")


def test_a_commit_statement_inside_run_commits_the_stamped_part_once_per_refused_attempt(
    fleet, one, tenant
) -> None:
    """fn: a write, COMMIT, another write. The second write is unstamped (the stamp was local
    to the transaction COMMIT ended) and the shard refuses it (40001, no version); run() takes
    that for a refusal of its transaction and ran fn again: the first write was committed by
    every attempt. Now the refusal of an unstamped statement ends it with ``Aborted``: the part
    the block's own COMMIT committed stays, once."""
    def fn(c):
        c.execute(ORDER, (tenant, "part-a"))
        c.execute("COMMIT")
        c.execute(ORDER, (tenant, "part-b"))

    with pytest.raises(shard_directory.Aborted):
        one.run("tenant", tenant, fn)
    committed = fleet.orders("shard_1", tenant)
    assert committed == ["part-a"], f"the block's own COMMIT, once: {committed}"


def test_a_rejected_of_another_routed_call_in_the_block_is_not_taken_for_this_attempts_refusal(
    fleet, directory, tenant
) -> None:
    """Inside ``with attempt:`` the transaction commits, then the block calls Router.run for
    another tenant (an audit row), which gives up: ``Rejected``, whose __cause__ is that
    transaction's 40001. attempts walks __cause__, takes it for a refusal of this attempt,
    and runs the block again: the committed order is committed again on every attempt."""
    other = f"{tenant}-audit"
    fleet.add_tenant(other, "shard_2")
    with Router(directory, fleet.shards, deadline=0.2) as audit:
        with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
            with pytest.raises(shard_directory.Rejected) as raised:
                for attempt in directory.attempts("tenant", tenant, deadline=2.0):
                    with attempt:
                        with conn.transaction():
                            conn.execute(*attempt.stamp)
                            conn.execute(ORDER, (tenant, f"a{attempt.number}"))
                        audit.run("tenant", other, lambda c: c.execute(RAISE_40001))
    committed = fleet.orders("shard_1", tenant)
    assert committed == ["a1"], f"one order placed; the shard has {committed}"
    assert raised.value.entity_id == other, "the audit's own Rejected, not a new one of ours"


def test_an_application_error_with_a_non_exception_orig_attribute_propagates_as_it_is(
    directory, tenant
) -> None:
    """Any other error is raised as it is. An application exception carrying an ``orig``
    attribute that is not an exception (the original value of a failed conversion, say) makes
    Attempt.__exit__ itself fail with AttributeError ('str' object has no attribute
    '__cause__'), masking the application's error."""

    class ConversionError(Exception):
        def __init__(self, orig: str) -> None:
            super().__init__(f"cannot convert {orig!r}")
            self.orig = orig

    with pytest.raises(ConversionError):
        for attempt in directory.attempts("tenant", tenant):
            with attempt:
                raise ConversionError("12,5")


def test_a_second_unstamped_transaction_in_an_attempt_does_not_rerun_the_committed_first(
    fleet, directory, engines, tenant
) -> None:
    """SQLAlchemy, one Session per attempt: commit() ends the stamped transaction, and the next
    write autobegins another, unstamped; the shard refuses it (40001 `missing`: no version).
    No re-run cures a transaction the application did not stamp, yet attempts learns from it
    and runs the block again -- re-committing the first transaction each time."""
    from test_attempts import Order

    with pytest.raises((sqlalchemy.exc.DBAPIError, shard_directory.ShardDirectoryError)):
        for attempt in directory.attempts("tenant", tenant, deadline=2.0):
            with attempt, Session(engines[attempt.shard]) as session:
                session.connection().exec_driver_sql(*attempt.stamp)
                session.add(Order(tenant_id=tenant, item=f"first{attempt.number}"))
                session.commit()
                session.add(Order(tenant_id=tenant, item="second"))
                session.commit()
    committed = fleet.orders("shard_1", tenant)
    assert len(committed) <= 1, f"the first transaction committed {len(committed)} times: {committed}"


def test_without_pipeline_support_the_same_transactions_behave_the_same(
    fleet, directory, tenant, monkeypatch
) -> None:
    """libpq older than 14 (psycopg's pure-Python build on an old system libpq): _PIPELINE is
    False and BEGIN and the stamp go one by one. The same outcomes."""
    import shard_directory.router as router_module

    monkeypatch.setattr(router_module, "_PIPELINE", False)
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
        with Router(deaf, fleet.shards, deadline=3.0, pool_size=1) as r:
            assert r.run("tenant", tenant, lambda c: c.execute(SHOW).fetchone(),
                         read_only=True)[:2] == ("on", "read committed")
            with pytest.raises(shard_directory.Aborted):
                def swallow(c):
                    c.execute(ORDER, (tenant, "x"))
                    with contextlib.suppress(psycopg.errors.DivisionByZero):
                        c.execute("SELECT 1/0")
                r.run("tenant", tenant, swallow)
            r.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "one")))
            fleet.cut_over(tenant)
            r.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "two")))
            assert deaf.stats()["rejections"]["moved"] == 1
            for s in ("shard_1", "shard_2"):
                assert _pool_check(r._pools[s]) == CLEAN
    assert fleet.orders("shard_1", tenant) == ["one"]
    assert fleet.orders("shard_2", tenant) == ["two"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_pooled_connections_cut_without_a_word_are_replaced(fleet, directory, tenant,
                                                           asynchronous) -> None:
    """The network drops every pooled connection (no FATAL from the server: the sockets are
    just closed): the pipelined BEGIN+stamp fails before anything reached the shard, and the
    transaction runs on a new connection, once."""
    from test_edges import _Proxy

    c = conninfo_to_dict(fleet.shards["shard_1"])
    proxy = _Proxy(c.get("host") or "127.0.0.1", int(c["port"]))

    def cut() -> None:
        for s in list(proxy.conns):
            with contextlib.suppress(OSError):
                s.shutdown(2)
            with contextlib.suppress(OSError):
                s.close()
        proxy.conns.clear()

    shards = dict(fleet.shards, shard_1=make_conninfo(fleet.shards["shard_1"], host="127.0.0.1",
                                                      port=proxy.port))
    try:
        if not asynchronous:
            with Router(directory, shards, deadline=3.0, pool_size=2) as r:
                for i in range(3):
                    r.run("tenant", tenant, lambda conn: None)
                    cut()
                    r.run("tenant", tenant, lambda conn: conn.execute(ORDER, (tenant, f"c{i}")))
        else:
            async def main():
                a = AsyncShardDirectory(directory._native)
                async with AsyncRouter(a, shards, deadline=3.0, pool_size=2) as r:
                    async def noop(conn):
                        return None

                    for i in range(3):
                        await r.run("tenant", tenant, noop)
                        cut()

                        async def order(conn, i=i):
                            await conn.execute(ORDER, (tenant, f"c{i}"))

                        await r.run("tenant", tenant, order)

            asyncio.run(main())
    finally:
        proxy.close()
    assert fleet.orders("shard_1", tenant) == ["c0", "c1", "c2"]


def test_a_lookup_miss_while_the_directory_is_gone_fails_promptly_and_hits_still_answer(
    fleet,
) -> None:
    from test_edges import _Proxy

    c = conninfo_to_dict(fleet.directory)
    proxy = _Proxy(c.get("host") or "127.0.0.1", int(c["port"]))
    name = f"gone{time.monotonic_ns()}"
    fleet.add_tenant(name, "shard_2")
    d = ShardDirectory(make_conninfo(fleet.directory, host="127.0.0.1", port=proxy.port),
                       connect_timeout=1.0, query_timeout=1.0)
    try:
        assert d.lookup("tenant", name).shard_name == "shard_2"
        proxy.close()
        for s in list(proxy.conns):
            with contextlib.suppress(OSError):
                s.shutdown(2)
        for i in range(5):
            started = time.monotonic()
            with pytest.raises(shard_directory.ShardDirectoryError):
                d.lookup("tenant", f"{name}-missing-{i}")
            assert time.monotonic() - started < 3.0
            assert d.lookup("tenant", name).shard_name == "shard_2"
    finally:
        proxy.close()
        d.close()
