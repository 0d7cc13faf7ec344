-- The check runs in the statement that stamps the transaction: no extra round trip, so the
-- difference between variants is the check itself.
\set aid random(1, 100000 * :scale)
BEGIN;
SELECT set_config('app.directory_version', '42', true);
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
END;
