"""The package as an application's least-privileged roles run it: on the directory only what
docs/operations.md lists for routers (its "router grants" block, read from the docs), on the
shards the documented USAGE on the extension's schema and the application's own tables."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import REPO
from shard_directory import Router, ShardDirectory

ORDER = "INSERT INTO orders (tenant_id, item) VALUES (%s, %s)"


def documented(which: str) -> str:
    """The SQL block after ``<!-- which -->`` in docs/operations.md."""
    docs = (REPO / "docs" / "operations.md").read_text()
    found = re.search(rf"<!-- {re.escape(which)} -->\s*```sql\n(.*?)```", docs, re.S)
    assert found, f"docs/operations.md has no {which!r} block"
    return found.group(1)


def as_role(conninfo: str, role: str) -> str:
    return make_conninfo(conninfo, user=role)


@pytest.fixture(scope="module")
def roles(fleet):
    """``app_router`` on the directory, ``app`` on each shard, holding what the docs say."""
    fleet.sql("directory", "DROP ROLE IF EXISTS app_router")
    fleet.sql("directory", "CREATE ROLE app_router LOGIN")
    for statement in documented("router grants").split(";"):
        if statement.strip():
            fleet.sql("directory", statement)
    for shard in fleet.shards:
        for statement in (
            "CREATE ROLE app LOGIN",
            # docs/operations.md: the application role needs USAGE on the extension's schema
            "GRANT USAGE ON SCHEMA shard_directory TO app",
            "GRANT SELECT, INSERT ON orders TO app",
        ):
            try:
                fleet.sql(shard, statement)
            except psycopg.errors.DuplicateObject:
                pass
    return as_role(fleet.directory, "app_router"), {
        name: as_role(conninfo, "app") for name, conninfo in fleet.shards.items()
    }


def test_a_router_on_the_documented_grants_writes_reads_and_repairs_a_stale_route(
    fleet, roles, tenant
) -> None:
    """Writes and reads as ``app``; a refusal of a stale route is repaired with the
    directory read as ``app_router`` (``changes_since``); a shard it was not given is learned
    from the registry (``shards``)."""
    directory_as_router, shards_as_app = roles
    with ShardDirectory(directory_as_router, listen=False, poll_interval=3600.0) as d:
        assert conninfo_to_dict(directory_as_router)["user"] == "app_router"
        with Router(d, {"shard_1": shards_as_app["shard_1"]}, learn_shards="user=app") as router:
            router.run("tenant", tenant, lambda conn: conn.execute(ORDER, (tenant, "first")))
            fleet.cut_over(tenant)
            router.run("tenant", tenant, lambda conn: conn.execute(ORDER, (tenant, "moved")))
            reads = router.read(
                "tenant",
                tenant,
                lambda conn: conn.execute(
                    "SELECT item FROM orders WHERE tenant_id = %s", (tenant,)
                ).fetchall(),
            )
        assert d.stats()["rejections"]["moved"] == 1
    assert reads.source == [("moved",)]
    assert fleet.orders("shard_1", tenant) == ["first"]
    assert fleet.orders("shard_2", tenant) == ["moved"]
