\set aid random(1, 100000 * :scale)
BEGIN;
SELECT set_config('app.directory_version', '42', true);
SELECT shard_directory.assert_directory_version();
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
END;
