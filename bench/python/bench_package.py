"""The Python half of ``bench_python`` (bench/src/bin/bench_python.rs starts the fleet, runs this
with the package built in release, and prints the tables): the package's cached lookup against
the guide's dict-based ``ShardDirectory.lookup``, and a stamped, checked one-row transaction
through ``Router.run`` against the same transaction on a plain psycopg connection.

Reads the fleet from the environment (``BENCH_DIRECTORY``: the directory's conninfo;
``BENCH_SHARD``: shard_1's; ``BENCH_ENTRIES`` tenants ``1``..N on shard_1, ``BENCH_SECONDS`` per
contender, ``BENCH_ROUNDS`` rounds interleaved) and prints one JSON object."""

from __future__ import annotations

import json
import os
import random
import statistics
import time

import psycopg

from shard_directory import Router, ShardDirectory, _native

BATCH = 64
SAMPLES = 20_000
TENANTS = 100


class GuideDirectory:
    """The guide's ``ShardDirectory`` (step 2), as written: a dict keyed by (type, id)."""

    def __init__(self, entries: dict[tuple[str, str], object], version: int) -> None:
        self._entries = entries
        self._version = version

    def lookup(self, entity_type: str, entity_id: str) -> object:
        key = (entity_type, entity_id)
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(key)
        return entry

    @property
    def version(self) -> int:
        return self._version


def per_lookup(lookup, order: list[str]) -> list[float]:
    """Nanoseconds per lookup, a sample per ``BATCH`` lookups of ``order``'s keys in turn."""
    samples = []
    clock = time.perf_counter_ns
    n = len(order)
    i = 0
    for _ in range(SAMPLES):
        start = clock()
        for _ in range(BATCH):
            lookup("tenant", order[i % n])
            i += 1
        samples.append((clock() - start) / BATCH)
    return samples


def quantiles(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    at = lambda q: samples[int((len(samples) - 1) * q)]  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99)}


def lookups(directory: ShardDirectory, entries: int, rounds: int) -> dict[str, dict[str, float]]:
    ids = [str(i) for i in range(1, entries + 1)]
    found = {("tenant", i): directory.lookup("tenant", i) for i in ids}
    guide = GuideDirectory(found, directory.version)
    rng = random.Random(7)
    order = [ids[rng.randrange(entries)] for _ in range(min(entries, 1 << 20))]
    misses = directory.stats()["cache_misses"]

    def loop_only(entity_type: str, entity_id: str) -> None:
        pass

    contenders = {
        "package": directory.lookup,
        "native": directory._native.lookup,
        "guide": guide.lookup,
        "call": loop_only,
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, lookup in contenders.items():
            samples[name] += per_lookup(lookup, order)
    assert directory.stats()["cache_misses"] == misses, "every timed lookup was a hit"
    return {name: quantiles(s) for name, s in samples.items()}


def transactions(
    directory: ShardDirectory, shard: str, seconds: float, rounds: int
) -> dict[str, dict[str, float]]:
    tenants = [str(i) for i in range(1, TENANTS + 1)]
    router = Router(directory, {"shard_1": shard}, pool_size=1)
    plain = psycopg.connect(shard, autocommit=True)
    plain.execute("CREATE TABLE IF NOT EXISTS orders_unprotected (LIKE orders INCLUDING ALL)")
    stamp = _native.stamp_sql("write")
    insert = "INSERT INTO orders (tenant_id, item) VALUES (%s, 'x')"

    def package(tenant: str) -> None:
        router.run("tenant", tenant, lambda conn: conn.execute(insert, (tenant,)))

    def by_hand(tenant: str) -> None:
        # The guide's execute_on_shard: the version set in the transaction, then the statement.
        params = {"version": str(directory.version), "entity_type": "tenant",
                  "entity_id": tenant, "left": "15000"}
        with plain.transaction():
            plain.execute(stamp, params)
            plain.execute(insert, (tenant,))

    def pipelined(tenant: str) -> None:
        # The same, BEGIN and the stamp sent together in one round trip, as the package does.
        params = {"version": str(directory.version), "entity_type": "tenant",
                  "entity_id": tenant, "left": "15000"}
        tx = psycopg.Transaction(plain)
        with plain.pipeline():
            tx.__enter__()
            plain.execute(stamp, params)
        try:
            plain.execute(insert, (tenant,))
        except BaseException as e:
            tx.__exit__(type(e), e, e.__traceback__)
            raise
        tx.__exit__(None, None, None)

    def unprotected(tenant: str) -> None:
        with plain.transaction():
            plain.execute("INSERT INTO orders_unprotected (tenant_id, item) VALUES (%s, 'x')",
                          (tenant,))

    contenders = {
        "package": package,
        "by_hand": by_hand,
        "pipelined": pipelined,
        "unprotected": unprotected,
    }
    for run in contenders.values():  # warm: pools, prepared statements, caches
        for tenant in tenants:
            run(tenant)
    per_second: dict[str, list[float]] = {name: [] for name in contenders}
    latency: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            run, done, clock = contenders[name], 0, time.perf_counter
            start = clock()
            while clock() - start < seconds:
                t0 = clock()
                run(tenants[done % TENANTS])
                latency[name].append((clock() - t0) * 1e6)
                done += 1
            per_second[name].append(done / (clock() - start))
    router.close()
    plain.close()
    return {
        name: {"tps": statistics.median(per_second[name]), **quantiles(latency[name])}
        for name in contenders
    }


def main() -> None:
    entries = int(os.environ["BENCH_ENTRIES"])
    seconds = float(os.environ["BENCH_SECONDS"])
    rounds = int(os.environ["BENCH_ROUNDS"])
    with ShardDirectory(os.environ["BENCH_DIRECTORY"], pool_size=8) as directory:
        result = {
            "lookup": lookups(directory, entries, rounds),
            "transaction": transactions(directory, os.environ["BENCH_SHARD"], seconds, rounds),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
