"""Route each tenant's work to the PostgreSQL shard the directory names, safely.

The cache, the watcher (LISTEN and the poll), the relay, read replicas, the shared cache, the
history's epoch and every routing decision (where to send an attempt, what a shard's refusal
teaches, how long to wait) come from the Rust client (``shard_directory._native``); Python owns
only its connections, psycopg 3's, pooled per shard.

    from shard_directory import ShardDirectory, Router

    with ShardDirectory("host=directory dbname=directory user=app") as directory:
        entry = directory.lookup("tenant", "8842")
        router = Router(directory, {"shard_1": "host=shard1 dbname=app user=app"})
        with router.transaction("tenant", "8842") as conn:
            conn.execute("INSERT INTO orders (tenant_id, item) VALUES (%s, %s)", ("8842", "book"))

``AsyncShardDirectory`` and ``AsyncRouter`` are the same for asyncio.
"""

from ._native import (
    Aborted,
    ConfigError,
    DirectoryBehind,
    DirectoryError,
    DirectoryUnavailable,
    Entry,
    FailClosed,
    ReadOnly,
    Rejected,
    ShardDirectoryError,
    ShardUnavailable,
    UnknownEntity,
    UnknownShard,
)
from .attempts import Attempt, Attempts
from .directory import AsyncShardDirectory, ShardDirectory
from .router import AsyncRouter, Reads, Router

__all__ = [
    "Aborted",
    "AsyncRouter",
    "Attempt",
    "Attempts",
    "AsyncShardDirectory",
    "ConfigError",
    "DirectoryBehind",
    "DirectoryError",
    "DirectoryUnavailable",
    "Entry",
    "FailClosed",
    "ReadOnly",
    "Reads",
    "Rejected",
    "Router",
    "ShardDirectory",
    "ShardDirectoryError",
    "ShardUnavailable",
    "UnknownEntity",
    "UnknownShard",
]
