"""The package off the paths its own tests take (from the attack on it): what an application
engineer relies on, under concurrency, faults and odd input. Every acknowledged write is
committed once where the directory says; every failure is a documented class (or psycopg's for
the statement's own errors) and changes nothing; nothing waits past its deadline, blocks the
event loop or outlives close(); bad input is refused before anything is sent."""

from __future__ import annotations

import asyncio
import collections
import gc
import select
import signal
import socket
import threading
import time

import psycopg
import pytest
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shard_directory
from conftest import client_threads
from shard_directory import AsyncRouter, AsyncShardDirectory, Router, ShardDirectory

ORDER = "INSERT INTO orders (tenant_id, item) VALUES (%s, %s)"
RAISE_40001 = "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$"


def _pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shard_directory:")]


def _freeze(fleet, tenant: str) -> int:
    """begin_move to shard_2 and freeze, in the directory; the freeze's version."""
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    return fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))[0][0]


def _abort(fleet, tenant: str) -> None:
    fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))


class _Proxy:
    """A TCP proxy to a server; ``hole = True`` turns it into a black hole (nothing forwarded,
    new connections accepted and never answered): the server unreachable, not refusing."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.hole = False
        self.closed = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.hole:
                continue
            u = socket.create_connection(self.target)
            self.conns.append(u)
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self.closed:
                ready, _, _ = select.select([a, b], [], [], 0.05)
                if self.hole:
                    continue
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


# --- 1. acknowledged writes -------------------------------------------------------------------


def test_a_transaction_block_that_swallows_a_40001_is_not_acknowledged(fleet, router, tenant) -> None:
    """Invariant 1: a block that catches a 40001 itself leaves the transaction aborted; leaving
    the block must not look like a commit (COMMIT of an aborted transaction is a ROLLBACK)."""
    acknowledged = False
    try:
        with router.transaction("tenant", tenant) as conn:
            conn.execute(ORDER, (tenant, "kept"))
            try:
                conn.execute(RAISE_40001)
            except psycopg.errors.SerializationFailure:
                pass  # the application's own "retry later" that forgets the transaction is dead
        acknowledged = True
    except (psycopg.Error, shard_directory.ShardDirectoryError):
        pass
    committed = fleet.orders("shard_1", tenant)
    assert not acknowledged or committed == ["kept"], (
        f"transaction() returned normally (acknowledged) but the shard has {committed}"
    )


def test_run_whose_callable_swallows_an_error_is_not_acknowledged(fleet, router, tenant) -> None:
    """Invariant 1 for run(): fn catches its statement's error and returns; run() returns its
    value as if committed, but the shard rolled the transaction back."""
    def order(conn: psycopg.Connection) -> str:
        conn.execute(ORDER, (tenant, "kept"))
        try:
            conn.execute(RAISE_40001)
        except psycopg.errors.SerializationFailure:
            pass
        return "done"

    try:
        result = router.run("tenant", tenant, order)
    except (psycopg.Error, shard_directory.ShardDirectoryError):
        result = None
    committed = fleet.orders("shard_1", tenant)
    assert result is None or committed == ["kept"], (
        f"run() returned {result!r} (acknowledged) but the shard has {committed}"
    )


def test_concurrent_writers_through_a_whole_move_commit_each_acknowledged_write_once(
    fleet, directory, tenant
) -> None:
    """Invariant 1 under a move (begin, freeze with the source fenced frozen, cutover, fence
    moved) while 8 threads write: every acknowledged write is on exactly one shard, once; none
    that failed is anywhere; after the cutover writes land on the target."""
    acked: collections.Counter = collections.Counter()
    failed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    with Router(directory, fleet.shards, deadline=10.0) as router:

        def writer(i: int) -> None:
            n = 0
            while not stop.is_set():
                item = f"w{i}-{n}"
                n += 1
                try:
                    router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, item)))
                    with lock:
                        acked[item] += 1
                except Exception as e:  # noqa: BLE001
                    with lock:
                        failed.append(f"{item}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
        time.sleep(0.2)
        fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))
        fleet.sql("shard_1", "SELECT shard_directory.fence_frozen('tenant', %s)", (tenant,))
        time.sleep(0.3)
        version = fleet.sql(
            "directory", "SELECT shard_directory.complete_move('tenant', %s)", (tenant,)
        )[0][0]
        fleet.sql(
            "shard_1",
            "SELECT shard_directory.fence_moved('tenant', %s, 'shard_2', %s)",
            (tenant, version),
        )
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "zz-after")))

    rows = collections.Counter(fleet.orders("shard_1", tenant) + fleet.orders("shard_2", tenant))
    assert not failed, failed[:5]
    assert sum(acked.values()) > 20, "the writers wrote"
    acked["zz-after"] += 1
    assert rows == acked, {k: (rows[k], acked[k]) for k in rows | acked if rows[k] != acked[k]}
    assert "zz-after" in fleet.orders("shard_2", tenant)


def test_a_repointed_entity_whose_old_shard_still_says_moved_is_never_written_elsewhere(
    fleet, tenant
) -> None:
    """Invariant 1: the directory names shard_1 again (an emergency re-point after a move),
    shard_1 still carries the fence "moved to shard_2". The router must not follow the shard's
    hint to a shard the directory does not name: refused, nothing written anywhere."""
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    fleet.sql("directory", "SELECT shard_directory.freeze('tenant', %s)", (tenant,))
    version = fleet.sql(
        "directory", "SELECT shard_directory.complete_move('tenant', %s)", (tenant,)
    )[0][0]
    fleet.sql(
        "shard_1", "SELECT shard_directory.fence_moved('tenant', %s, 'shard_2', %s)", (tenant, version)
    )
    with psycopg.connect(fleet.directory) as conn:
        conn.execute("SET LOCAL shard_directory.allow_repoint = on")
        conn.execute(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_1' "
            "WHERE entity_type = 'tenant' AND entity_id = %s",
            (tenant,),
        )
    with ShardDirectory(fleet.directory) as d, Router(d, fleet.shards, deadline=1.0) as router:
        assert d.lookup("tenant", tenant).shard_name == "shard_1"
        with pytest.raises(shard_directory.Rejected) as raised:
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "repointed")))
        assert raised.value.reason == "moved" and raised.value.retryable is True
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []


# --- 2. errors, bad input, deadlines ----------------------------------------------------------


def test_a_pooled_connection_the_shard_terminated_does_not_fail_the_next_run(
    fleet, directory, tenant
) -> None:
    """Invariant 4: a shard restarts / an idle connection is killed (pg_terminate_backend).
    The next run() is handed the dead pooled connection; BEGIN fails before anything of the
    transaction reached the shard, so it is safe to run it on a fresh connection."""
    with Router(directory, fleet.shards, deadline=5.0) as router:
        router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "before")))
        fleet.sql(
            "shard_1",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        time.sleep(0.2)
        router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "after")))
    assert fleet.orders("shard_1", tenant) == ["after", "before"]


def test_a_closed_router_says_so_at_once_even_for_a_frozen_entity(fleet, directory, tenant) -> None:
    """Invariant 2: a closed router gives a clear error; it does not wait out a freeze for the
    whole deadline first and then raise ReadOnly."""
    version = _freeze(fleet, tenant)
    try:
        assert directory.wait_for_version(version, timeout=10)
        router = Router(directory, fleet.shards, deadline=2.0)
        router.close()
        started = time.monotonic()
        with pytest.raises(shard_directory.ConfigError):
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "late")))
        assert time.monotonic() - started < 0.5
    finally:
        _abort(fleet, tenant)


def test_a_run_waiting_for_a_connection_when_the_router_closes_raises_a_package_error(
    fleet, directory, tenant
) -> None:
    """Invariants 2 and 3: close() with transactions in flight. The one holding the connection
    commits; the one waiting for the pool gets the package's error (ConfigError: the router is
    closed), not psycopg_pool's PoolClosed."""
    router = Router(directory, fleet.shards, deadline=5.0, pool_size=1)
    holding = threading.Event()
    outcome: dict[str, object] = {}

    def holder() -> None:
        def order(conn: psycopg.Connection) -> None:
            conn.execute(ORDER, (tenant, "held"))
            holding.set()
            time.sleep(1.0)

        try:
            router.run("tenant", tenant, order)
            outcome["holder"] = "committed"
        except Exception as e:  # noqa: BLE001
            outcome["holder"] = e

    def waiter() -> None:
        holding.wait()
        try:
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "waiter")))
            outcome["waiter"] = "committed"
        except Exception as e:  # noqa: BLE001
            outcome["waiter"] = e

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for t in threads:
        t.start()
    holding.wait(timeout=10)
    time.sleep(0.2)
    router.close()
    for t in threads:
        t.join(timeout=30)
    assert outcome["holder"] == "committed"
    assert fleet.orders("shard_1", tenant) == ["held"]
    assert isinstance(outcome["waiter"], shard_directory.ShardDirectoryError), repr(outcome["waiter"])


def test_a_huge_attempt_timeout_is_refused_or_capped_not_a_server_error(
    fleet, directory, tenant
) -> None:
    """Invariant 2: attempt_timeout=30 days passes the settings' checks; every run then fails
    with the server's InvalidParameterValue (statement_timeout out of range) from the stamp."""
    try:
        with Router(directory, fleet.shards, attempt_timeout=30 * 86400.0) as router:
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "ok")))
    except shard_directory.ConfigError:
        return
    assert fleet.orders("shard_1", tenant) == ["ok"]


def test_bad_router_settings_are_refused_when_the_router_is_made(fleet, directory) -> None:
    """Invariant 2: a negative deadline (or attempt_timeout, backoff) is a ConfigError at
    Router(...), not a Router that then fails every transaction."""
    for bad in ({"deadline": -1.0}, {"attempt_timeout": -1.0}, {"base_backoff": -0.1}):
        with pytest.raises(shard_directory.ConfigError):
            Router(directory, fleet.shards, **bad).close()


def test_an_entity_id_of_none_is_a_type_error_not_tenant_None(fleet, directory, router) -> None:
    """Invariant 2: None is not an id. str(None) makes it the tenant "None"."""
    fleet.add_tenant("None", "shard_1")
    with pytest.raises(TypeError):
        directory.lookup("tenant", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        router.run("tenant", None, lambda c: c.execute(ORDER, ("None", "x")))  # type: ignore[arg-type]
    assert fleet.orders("shard_1", "None") == []


def test_an_entity_id_with_a_nul_byte_gives_a_clear_error(directory) -> None:
    """Invariant 2: an id PostgreSQL text cannot hold. Expected: ValueError (or UnknownEntity);
    got: DirectoryError 'shard directory query failed: db error'."""
    with pytest.raises((ValueError, shard_directory.UnknownEntity)):
        directory.lookup("tenant", "py\x00nul")


def test_the_sync_router_refuses_a_coroutine_function(fleet, router, tenant) -> None:
    """Invariant 2: an async fn given to Router.run returns an un-awaited coroutine, and the
    empty transaction is committed and acknowledged."""

    async def order(conn: psycopg.AsyncConnection) -> None:
        await conn.execute(ORDER, (tenant, "async"))

    with pytest.raises(TypeError):
        router.run("tenant", tenant, order)  # type: ignore[arg-type]


def test_async_shard_directory_made_from_a_conninfo_is_an_error_at_once(fleet) -> None:
    """Invariant 2: AsyncShardDirectory("host=...") (as ShardDirectory is made) builds an object
    whose every use raises AttributeError ('str' object has no attribute ...)."""
    with pytest.raises((TypeError, shard_directory.ConfigError)):
        AsyncShardDirectory(fleet.directory)  # type: ignore[arg-type]


def test_a_frozen_write_ends_by_its_deadline_while_the_directory_is_unreachable(
    fleet, tenant
) -> None:
    """Invariant 2: nothing hangs past the deadline. The directory turns into a black hole
    while a write waits out a freeze (deadline 1 s): the wait's directory queries each take the
    query timeout (5 s)."""
    version = _freeze(fleet, tenant)
    address = conninfo_to_dict(fleet.directory)
    proxy = _Proxy("127.0.0.1", int(address["port"]))
    try:
        d = ShardDirectory(make_conninfo(fleet.directory, port=proxy.port))
        assert d.wait_for_version(version, timeout=10)
        assert d.lookup("tenant", tenant).state == "read_only"
        router = Router(d, fleet.shards, deadline=1.0)
        proxy.hole = True
        started = time.monotonic()
        with pytest.raises(shard_directory.ShardDirectoryError):
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "late")))
        elapsed = time.monotonic() - started
        router.close()
        d.close()
        assert elapsed < 2.5, f"deadline 1 s, returned after {elapsed:.1f} s"
    finally:
        proxy.close()
        _abort(fleet, tenant)
    assert fleet.orders("shard_1", tenant) == [] and fleet.orders("shard_2", tenant) == []


def test_a_pool_exhausted_is_shard_unavailable_within_the_attempt_time(
    fleet, directory, tenant
) -> None:
    """Invariants 2 and 4: one connection, held; the next run waits its attempt's time and
    raises ShardUnavailable (retryable, naming the shard), changing nothing."""
    with Router(directory, fleet.shards, pool_size=1, attempt_timeout=0.5, deadline=0.5) as router:
        holding, release = threading.Event(), threading.Event()

        def hold(conn: psycopg.Connection) -> None:
            holding.set()
            release.wait(10)

        def holder() -> None:
            try:
                router.run("tenant", tenant, hold)
            except psycopg.Error:
                pass  # held past its own attempt time: the shard ended it

        t = threading.Thread(target=holder)
        t.start()
        holding.wait(10)
        started = time.monotonic()
        with pytest.raises(shard_directory.ShardUnavailable) as raised:
            router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "starved")))
        elapsed = time.monotonic() - started
        release.set()
        t.join(10)
    assert 0.3 < elapsed < 1.5
    assert (raised.value.shard, raised.value.retryable) == ("shard_1", True)
    assert fleet.orders("shard_1", tenant) == []


def test_a_stale_refusal_by_the_target_of_a_dual_read_is_learned_and_rerun(fleet, tenant) -> None:
    """Invariant 2 (read): while migrating, the target refuses the read as stale (40001, its
    min_accepted above the client's version). A refusal is learned from and re-run (as the Rust
    router does); the package reports it as `target_unavailable` and learns nothing."""
    fleet.sql("directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,))
    try:
        with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as deaf:
            assert deaf.lookup("tenant", tenant).state == "migrating"
            known = deaf.version
            fleet.add_tenant(f"{tenant}-bump", "shard_1")
            current = fleet.sql("directory", "SELECT shard_directory.current_version()")[0][0]
            fleet.sql("shard_2", "SELECT shard_directory.raise_min_accepted(%s)", (current,))
            with Router(deaf, fleet.shards, deadline=3.0) as router:
                reads = router.read("tenant", tenant, lambda c: c.execute("SELECT 1").fetchone()[0])
            assert reads.target_unavailable is None, reads.target_unavailable
            assert reads.both and deaf.version > known
    finally:
        _abort(fleet, tenant)


# --- 3. threads, shutdown, signals, the event loop --------------------------------------------


def test_close_ends_the_clients_threads_even_while_an_error_of_a_routed_call_is_kept(fleet) -> None:
    """Invariant 3: an application keeps the last error (for a health page, a log handler). Its
    traceback holds run()'s Routing, which holds the runtime: close() leaves the runtime's threads
    (and the watcher's debug server) running."""
    gc.collect()
    before = client_threads()
    directory = ShardDirectory(fleet.directory)
    router = Router(directory, fleet.shards, deadline=1.0)
    kept = None
    try:
        router.run("tenant", "no-such-tenant", lambda c: None)
    except shard_directory.UnknownEntity as e:
        kept = e
    router.close()
    directory.close()
    assert directory.closed
    assert client_threads() == before, "threads of the client outlive close()"
    assert kept is not None


def test_a_shard_learned_while_the_router_closes_leaves_no_pool_behind(fleet, directory) -> None:
    """Invariant 3: a run() learning a shard from the registry races close() (here made
    deterministic: close() lands during the registry read). The pool it then makes is added to a
    closed router: its threads and connection outlive close()."""
    fleet.add_tenant("py-learn-race", "shard_2")
    router = Router(directory, {}, learn_shards="user=postgres")
    real = directory.shard_conninfo

    class Racing:
        """The directory, but close() happens while the registry is read."""

        def __getattr__(self, name):
            return getattr(directory, name)

        def shard_conninfo(self, shard: str):
            conninfo = real(shard)
            router.close()
            return conninfo

    router.directory = Racing()  # type: ignore[assignment]
    try:
        router.run("tenant", "py-learn-race", lambda c: c.execute(ORDER, ("py-learn-race", "x")))
    except shard_directory.ShardDirectoryError:
        pass
    leaked = _pool_threads()
    router.close()  # a second close() takes it
    assert leaked == [], f"pool threads alive after close(): {leaked}"


def test_a_signal_interrupts_a_frozen_write_wait(fleet, directory, tenant) -> None:
    """Invariant 3 / 5: Ctrl-C (SIGINT, here SIGALRM) during a write waiting out a freeze is
    handled only when the native wait returns: after the whole deadline."""
    version = _freeze(fleet, tenant)
    handled: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda *a: handled.append(time.monotonic()))
    try:
        assert directory.wait_for_version(version, timeout=10)
        with Router(directory, fleet.shards, deadline=4.0) as router:
            started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(shard_directory.ReadOnly):
                router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "late")))
        assert handled, "the handler ran"
        assert handled[0] - started < 1.0, f"handled {handled[0] - started:.1f} s after the start"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _abort(fleet, tenant)


def test_keyboard_interrupt_and_generator_exit_inside_a_transaction_roll_back(
    fleet, router, tenant
) -> None:
    """Invariant 5: BaseExceptions in the block roll it back and leave the pool usable."""
    with pytest.raises(KeyboardInterrupt):
        with router.transaction("tenant", tenant) as conn:
            conn.execute(ORDER, (tenant, "interrupted"))
            raise KeyboardInterrupt

    def streaming():
        with router.transaction("tenant", tenant) as conn:
            conn.execute(ORDER, (tenant, "abandoned"))
            yield 1
            conn.execute(ORDER, (tenant, "never"))

    gen = streaming()
    next(gen)
    gen.close()  # GeneratorExit inside the block
    assert fleet.orders("shard_1", tenant) == []
    for i in range(10):  # more than the pool's size: no connection was lost
        router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, f"after{i}")))
    assert len(fleet.orders("shard_1", tenant)) == 10


def test_asyncio_frozen_writes_do_not_starve_another_tenants_write(fleet, tenant) -> None:
    """Invariants 3 and 4: twelve tasks write to a frozen tenant (each legitimately waits out the
    freeze, 3 s); a write to an active tenant must not wait for them. Each wait occupies a thread
    of the loop's default executor (min(32, cpus + 4)), so the active tenant's write queues behind
    them."""
    frozen = f"{tenant}-frozen"
    fleet.add_tenant(frozen, "shard_1")
    version = _freeze(fleet, frozen)

    async def main() -> float:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            assert await d.wait_for_version(version, timeout=10)
            await d.lookup("tenant", tenant)
            async with AsyncRouter(d, fleet.shards, deadline=3.0) as router:

                async def late(conn: psycopg.AsyncConnection) -> None:
                    await conn.execute(ORDER, (frozen, "late"))

                async def order(conn: psycopg.AsyncConnection) -> None:
                    await conn.execute(ORDER, (tenant, "ok"))

                waiting = [asyncio.create_task(router.run("tenant", frozen, late)) for _ in range(12)]
                await asyncio.sleep(0.2)
                started = time.monotonic()
                await router.run("tenant", tenant, order)
                elapsed = time.monotonic() - started
                results = await asyncio.gather(*waiting, return_exceptions=True)
                assert all(isinstance(r, shard_directory.ReadOnly) for r in results), results
                return elapsed

    try:
        elapsed = asyncio.run(main())
    finally:
        _abort(fleet, frozen)
    assert fleet.orders("shard_1", tenant) == ["ok"]
    assert elapsed < 1.0, f"an active tenant's write took {elapsed:.1f} s behind frozen ones"


def test_cancelling_an_asyncio_frozen_write_stops_its_wait(fleet, tenant) -> None:
    """Invariant 3: a request timeout cancels a write waiting out a freeze (deadline 4 s). The
    wait goes on in its thread: asyncio.run() (which joins the default executor) returns only at
    the deadline, and the thread is tied up until then."""
    version = _freeze(fleet, tenant)

    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            assert await d.wait_for_version(version, timeout=10)
            async with AsyncRouter(d, fleet.shards, deadline=4.0) as router:

                async def late(conn: psycopg.AsyncConnection) -> None:
                    await conn.execute(ORDER, (tenant, "late"))

                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(router.run("tenant", tenant, late), 0.3)

    try:
        started = time.monotonic()
        asyncio.run(main())
        elapsed = time.monotonic() - started
    finally:
        _abort(fleet, tenant)
    assert fleet.orders("shard_1", tenant) == []
    assert elapsed < 2.0, f"cancelled at 0.3 s; asyncio.run returned after {elapsed:.1f} s"


def test_many_asyncio_tasks_on_one_router_commit_each_write_once_without_blocking_the_loop(
    fleet, tenant
) -> None:
    """Invariant 4 (asyncio): 60 tasks, 3 tenants on both shards, a pool of 3 per shard; every
    write committed once on its tenant's shard; a heartbeat keeps ticking."""
    tenants = [tenant, f"{tenant}-b", f"{tenant}-c"]
    fleet.add_tenant(tenants[1], "shard_2")
    fleet.add_tenant(tenants[2], "shard_1")

    async def main() -> int:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards, pool_size=3, deadline=10.0) as router:
                ticks = 0

                async def beat() -> None:
                    nonlocal ticks
                    while True:
                        ticks += 1
                        await asyncio.sleep(0.005)

                heart = asyncio.create_task(beat())

                async def one(i: int) -> None:
                    t = tenants[i % 3]

                    async def order(conn: psycopg.AsyncConnection) -> None:
                        await conn.execute(ORDER, (t, f"i{i:03d}"))

                    await router.run("tenant", t, order)

                await asyncio.gather(*(one(i) for i in range(60)))
                heart.cancel()
                return ticks

    ticks = asyncio.run(main())
    assert ticks > 2
    for k, t in enumerate(tenants):
        shard = "shard_2" if k == 1 else "shard_1"
        assert fleet.orders(shard, t) == [f"i{i:03d}" for i in range(60) if i % 3 == k]


def test_many_threads_on_one_router_commit_each_write_once(fleet, directory) -> None:
    """Invariant 4: 16 threads, 25 writes each, over 8 tenants on both shards, a pool of 3."""
    tenants = [f"py-threads-{i}" for i in range(8)]
    for i, t in enumerate(tenants):
        fleet.add_tenant(t, "shard_1" if i % 2 else "shard_2")
    acked: collections.Counter = collections.Counter()
    errors: list[str] = []
    lock = threading.Lock()
    with Router(directory, fleet.shards, pool_size=3, deadline=10.0) as router:

        def worker(i: int) -> None:
            for j in range(25):
                t, item = tenants[(i + j) % 8], f"{i}-{j}"
                try:
                    router.run("tenant", t, lambda c: c.execute(ORDER, (t, item)))
                    with lock:
                        acked[(t, item)] += 1
                except Exception as e:  # noqa: BLE001
                    with lock:
                        errors.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    assert errors == []
    rows: collections.Counter = collections.Counter()
    for i, t in enumerate(tenants):
        assert fleet.orders("shard_2" if i % 2 else "shard_1", t) == []
        for item in fleet.orders("shard_1" if i % 2 else "shard_2", t):
            rows[(t, item)] += 1
    assert rows == acked and len(acked) == 400


# --- 5. edge input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entity_id",
    ["o'brien", 'q"uote', "ü🎉 名前", "a;b--c", " padded ", "back\\slash", "x" * 2000, "100%"],
)
def test_odd_entity_ids_are_routed_and_committed_once(fleet, router, entity_id) -> None:
    """Invariant 5: quotes, unicode, SQL-looking, padded, long ids, '%' in the id."""
    entity_id = f"{entity_id}{time.monotonic_ns()}"
    fleet.add_tenant(entity_id, "shard_2")

    def order(conn: psycopg.Connection) -> str:
        conn.execute(ORDER, (entity_id, "odd"))
        return conn.execute("SELECT current_setting('app.entity_id')").fetchone()[0]

    assert router.run("tenant", entity_id, order) == entity_id
    assert fleet.orders("shard_2", entity_id) == ["odd"]
    assert fleet.orders("shard_1", entity_id) == []


def test_percent_in_sql_read_only_and_isolation_do_not_leak_between_transactions(
    fleet, directory, router, tenant
) -> None:
    """Invariant 5: '%' with and without parameters; read_only=True and SERIALIZABLE apply to
    their transaction only (the pooled connection is reused after); a read-only run passes a
    frozen entity at once."""
    assert router.run("tenant", tenant, lambda c: c.execute("SELECT '100%'").fetchone()) == ("100%",)
    assert router.run(
        "tenant", tenant, lambda c: c.execute("SELECT '100%%', %s", (1,)).fetchone()
    ) == ("100%", 1)
    show = "SELECT current_setting('transaction_read_only'), current_setting('transaction_isolation')"
    assert router.run(
        "tenant", tenant, lambda c: c.execute(show).fetchone(), isolation=IsolationLevel.SERIALIZABLE
    ) == ("off", "serializable")
    assert router.run("tenant", tenant, lambda c: c.execute(show).fetchone(), read_only=True) == (
        "on",
        "read committed",
    )
    with router.transaction("tenant", tenant) as conn:
        assert conn.execute(show).fetchone() == ("off", "read committed")
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        router.run("tenant", tenant, lambda c: c.execute(ORDER, (tenant, "ro")), read_only=True)
    version = _freeze(fleet, tenant)
    try:
        assert directory.wait_for_version(version, timeout=10)
        started = time.monotonic()
        assert router.run("tenant", tenant, lambda c: 1, read_only=True) == 1
        assert time.monotonic() - started < 0.5
    finally:
        _abort(fleet, tenant)
    assert fleet.orders("shard_1", tenant) == []


def test_an_entrys_repr_is_pythons_not_rusts(fleet, directory, tenant) -> None:
    """Entry's repr shows Rust's Option: target_shard=Some("shard_2")."""
    version = fleet.sql(
        "directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,)
    )[0][0]
    try:
        assert directory.wait_for_version(version, timeout=10)
        text = repr(directory.lookup("tenant", tenant))
        assert "Some(" not in text, text
    finally:
        _abort(fleet, tenant)


def test_the_async_router_has_a_transaction_block_as_the_sync_one(fleet, tenant) -> None:
    """API parity (the README: AsyncRouter is "the same for asyncio"): Router.transaction() has no
    asyncio counterpart."""

    async def main() -> None:
        async with await AsyncShardDirectory.connect(fleet.directory) as d:
            async with AsyncRouter(d, fleet.shards) as router:
                async with router.transaction("tenant", tenant) as conn:  # type: ignore[attr-defined]
                    await conn.execute(ORDER, (tenant, "async-block"))

    asyncio.run(main())
    assert fleet.orders("shard_1", tenant) == ["async-block"]
