"""``ShardDirectory.attempts``: a routed transaction on the application's own connections,
plain psycopg and SQLAlchemy sessions (the README's example, run as written)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import Identity, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from shard_directory import DirectoryBehind, ShardDirectory


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    tenant_id: Mapped[str] = mapped_column(String, primary_key=True)
    order_id: Mapped[int] = mapped_column(Identity(), primary_key=True)
    item: Mapped[str]


@pytest.fixture
def deaf(fleet):
    """A client told of nothing after its reads (no LISTEN, an hourly poll)."""
    with ShardDirectory(fleet.directory, listen=False, poll_interval=3600.0) as d:
        yield d


def test_a_sqlalchemy_session_is_stamped_refused_on_a_stale_route_and_rerun_where_it_moved(
    fleet, deaf, engines, tenant
) -> None:
    """The README's SQLAlchemy example: the tenant moved behind the client's back; the first
    attempt's flush on shard_1 is refused (40001 `moved`, wrapped by SQLAlchemy), learned from,
    and the second attempt commits the order once, on shard_2."""
    assert deaf.lookup("tenant", tenant).shard_name == "shard_1"
    fleet.cut_over(tenant)
    shards = []
    for attempt in deaf.attempts("tenant", tenant):
        with attempt, Session(engines[attempt.shard]) as session, session.begin():
            shards.append(attempt.shard)
            session.connection().exec_driver_sql(*attempt.stamp)
            session.add(Order(tenant_id=tenant, item="book"))
    assert shards == ["shard_1", "shard_2"]
    assert fleet.orders("shard_2", tenant) == ["book"]
    assert fleet.orders("shard_1", tenant) == []
    assert deaf.stats()["rejections"]["moved"] == 1


def test_a_plain_psycopg_connection_and_a_read(fleet, directory, tenant) -> None:
    """Any connection will do: the stamp first, then the work; a read is checked as a read."""
    with psycopg.connect(fleet.shards["shard_1"], autocommit=True) as conn:
        for attempt in directory.attempts("tenant", tenant):
            with attempt, conn.transaction():
                conn.execute(*attempt.stamp)
                conn.execute("INSERT INTO orders (tenant_id, item) VALUES (%s, 'pen')", (tenant,))
        for attempt in directory.attempts("tenant", tenant, read_only=True):
            with attempt, conn.transaction():
                conn.execute(*attempt.stamp)
                count = conn.execute(
                    "SELECT count(*) FROM orders WHERE tenant_id = %s", (tenant,)
                ).fetchone()
    assert count == (1,)
    assert attempt.number == 1 and attempt.shard == "shard_1"


def test_an_error_that_is_not_a_refusal_ends_the_loop_as_it_is(fleet, directory, engines, tenant) -> None:
    attempts = []
    with pytest.raises(sqlalchemy.exc.ProgrammingError):
        for attempt in directory.attempts("tenant", tenant):
            attempts.append(attempt.number)
            with attempt, Session(engines[attempt.shard]) as session, session.begin():
                session.connection().exec_driver_sql(*attempt.stamp)
                session.execute(sqlalchemy.text("SELECT * FROM no_such_table"))
    assert attempts == [1]


def test_an_attempt_not_run_inside_with_is_refused(directory, tenant) -> None:
    attempts = directory.attempts("tenant", tenant)
    next(attempts)
    with pytest.raises(RuntimeError, match="with attempt"):
        next(attempts)


def test_a_shard_that_requires_a_version_the_directory_has_not_reached_says_so(
    fleet, directory, tenant
) -> None:
    """A shard's minimum above every version the directory made: no re-run cures it, and it is
    not retried until the deadline: ``DirectoryBehind`` at once."""
    conninfo = fleet.shards["shard_1"]
    fleet.sql("shard_1", "SELECT shard_directory.fence_owned('tenant', %s, 1000000000)", (tenant,))
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            with pytest.raises(DirectoryBehind):
                for attempt in directory.attempts("tenant", tenant, deadline=5.0):
                    with attempt, conn.transaction():
                        conn.execute(*attempt.stamp)
    finally:
        fleet.sql("shard_1", "SELECT shard_directory.unfence('tenant', %s)", (tenant,))
