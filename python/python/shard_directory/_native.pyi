"""Types of the Rust extension module (python/src)."""

from collections.abc import Callable
from typing import final

class ShardDirectoryError(Exception):
    retryable: bool

class DirectoryUnavailable(ShardDirectoryError): ...
class DirectoryError(ShardDirectoryError): ...

class UnknownEntity(ShardDirectoryError):
    entity_type: str
    entity_id: str

class UnknownShard(ShardDirectoryError):
    entity_type: str
    entity_id: str
    shard: str

class ReadOnly(ShardDirectoryError):
    entity_type: str
    entity_id: str

class FailClosed(ShardDirectoryError):
    entity_type: str
    entity_id: str
    reason: str

class Rejected(ShardDirectoryError):
    entity_type: str
    entity_id: str
    shard: str
    reason: str
    attempts: int

class DirectoryBehind(ShardDirectoryError):
    entity_type: str
    entity_id: str
    shard: str
    minimum: int
    directory_version: int

class ShardUnavailable(ShardDirectoryError):
    shard: str

class Aborted(ShardDirectoryError): ...
class ConfigError(ShardDirectoryError): ...

@final
class Entry:
    shard_name: str
    target_shard: str | None
    state: str
    region: str | None
    version: int
    directory_version: int

@final
class Route:
    entry: Entry
    version: int
    attempt: int
    time_left: float
    stamp_params: dict[str, str]

@final
class Pending:
    def cancel(self) -> None: ...

@final
class Routing:
    def next(self) -> Route: ...
    def next_soon(self, done: Callable[[bool, object], None]) -> Pending: ...
    def refused_soon(
        self,
        route: Route,
        sqlstate: str,
        detail: str | None,
        can_route_to: Callable[[str], bool],
        done: Callable[[bool, object], None],
    ) -> Pending: ...
    def refused(
        self,
        route: Route,
        sqlstate: str,
        detail: str | None,
        can_route_to: Callable[[str], bool],
    ) -> bool: ...

@final
class Directory:
    def __init__(
        self,
        conninfo: str,
        *,
        listen: bool = True,
        listen_conninfo: str | None = None,
        poll_interval: float = 30.0,
        connect_timeout: float = 5.0,
        query_timeout: float = 5.0,
        policy: str = "serve_from_cache",
        pooled: bool = False,
        pool_size: int | None = None,
        max_cached_entries: int | None = None,
        replicas: list[str] = ...,
        replica_wait: float | None = None,
        relay_url: str | None = None,
        relay_key: bytes | None = None,
        relay_silence: float | None = None,
        shared_cache_url: str | None = None,
    ) -> None: ...
    def lookup(self, entity_type: str, entity_id: str | int) -> Entry: ...
    def lookup_cached(self, entity_type: str, entity_id: str | int) -> Entry | None: ...
    @property
    def version(self) -> int: ...
    @property
    def connected(self) -> bool: ...
    @property
    def listening(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def refresh(self) -> int: ...
    def wait_for_version(self, version: int, timeout: float) -> bool: ...
    def debug_json(self) -> str: ...
    def serve_debug(self, address: str) -> str: ...
    def shard_conninfo(self, shard: str) -> str | None: ...
    def routing(
        self,
        entity_type: str,
        entity_id: str | int,
        *,
        write: bool,
        deadline: float,
        attempt_timeout: float,
        base_backoff: float,
        max_backoff: float,
    ) -> Routing: ...
    def close(self) -> None: ...

def entity(entity_type: str, entity_id: str | int) -> tuple[str, str]: ...
def stamp_sql(check: str) -> str: ...
def refusal_reason(sqlstate: str, detail: str | None = None) -> str | None: ...
