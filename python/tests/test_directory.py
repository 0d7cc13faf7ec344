"""``ShardDirectory``: the guide's lookup and version, the watcher, errors, metrics, shutdown."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

import shard_directory
from conftest import client_threads
from shard_directory import ShardDirectory


def test_lookup_reads_the_entry_and_then_serves_it_from_the_cache(fleet, tenant) -> None:
    with ShardDirectory(fleet.directory) as directory:
        entry = directory.lookup("tenant", tenant)
        assert (entry.shard_name, entry.state, entry.target_shard) == ("shard_1", "active", None)
        assert entry.directory_version <= directory.version
        hits = directory.stats()["cache_hits"]
        assert directory.lookup("tenant", tenant) == entry
        assert directory.stats()["cache_hits"] == hits + 1


def test_a_change_reaches_the_cache_through_the_watcher(fleet, tenant) -> None:
    with ShardDirectory(fleet.directory, poll_interval=3600.0) as directory:
        assert directory.lookup("tenant", tenant).shard_name == "shard_1"
        version = fleet.sql(
            "directory", "SELECT shard_directory.begin_move('tenant', %s, 'shard_2')", (tenant,)
        )[0][0]
        assert directory.wait_for_version(version, timeout=10), "the NOTIFY reached the watcher"
        entry = directory.lookup("tenant", tenant)
        assert (entry.state, entry.target_shard) == ("migrating", "shard_2")
        fleet.sql("directory", "SELECT shard_directory.abort_move('tenant', %s)", (tenant,))


def test_an_unknown_entity_raises_its_class_with_its_names(fleet) -> None:
    with ShardDirectory(fleet.directory) as directory:
        with pytest.raises(shard_directory.UnknownEntity) as raised:
            directory.lookup("tenant", "no-such-tenant")
    e = raised.value
    assert isinstance(e, shard_directory.ShardDirectoryError)
    assert (e.entity_type, e.entity_id, e.retryable) == ("tenant", "no-such-tenant", False)


def test_bad_settings_raise_config_error_before_connecting(fleet) -> None:
    for settings in ({"policy": "maybe"}, {"poll_interval": -1.0}, {"relay_url": "redis://x"}):
        with pytest.raises(shard_directory.ConfigError):
            ShardDirectory(fleet.directory, **settings)
    with pytest.raises(shard_directory.ConfigError):
        ShardDirectory("port=not-a-number")


def test_an_unreachable_directory_is_unavailable_and_retryable() -> None:
    with pytest.raises(shard_directory.DirectoryUnavailable) as raised:
        ShardDirectory("host=127.0.0.1 port=1 dbname=directory", connect_timeout=1.0)
    assert raised.value.retryable is True


def test_the_debug_endpoint_serves_the_version_as_in_the_guide(fleet, tenant) -> None:
    with ShardDirectory(fleet.directory) as directory:
        directory.lookup("tenant", tenant)
        address = directory.serve_debug("127.0.0.1:0")
        with urllib.request.urlopen(f"http://{address}/debug/directory", timeout=5) as r:
            served = json.load(r)
        assert served["version"] == directory.version
        assert served["connected"] is True
        assert served["stats"]["cache_misses"] >= 1


def test_close_ends_the_clients_threads_and_further_calls_raise(fleet, tenant) -> None:
    before = client_threads()
    directory = ShardDirectory(fleet.directory)
    assert client_threads() > before
    directory.close()
    assert client_threads() == before, "no thread of the client outlives close()"
    assert directory.closed
    directory.close()  # idempotent
    with pytest.raises(shard_directory.ConfigError):
        directory.lookup("tenant", tenant)


def test_a_lookup_releases_the_gil_while_it_waits(fleet, tenant) -> None:
    """Lookups from many threads at once, each a miss (a fresh client): all answer."""
    with ShardDirectory(fleet.directory) as directory:
        found: list[str] = []

        def look() -> None:
            found.append(directory.lookup("tenant", tenant).shard_name)

        threads = [threading.Thread(target=look) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert found == ["shard_1"] * 16
