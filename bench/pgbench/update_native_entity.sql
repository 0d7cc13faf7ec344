-- The check runs in the statement that stamps the transaction: no extra round trip, so the
-- difference between variants is the check itself.
\set aid random(1, 100000 * :scale)
\set delta random(-5000, 5000)
BEGIN;
SELECT set_config('app.directory_version', '42', true), set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', :aid::text, true), shard_directory.assert_directory_version();
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
END;
