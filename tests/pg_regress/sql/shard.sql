-- A DBA's session on a shard: protect a table, see what stale and unversioned writes get,
-- fence a tenant that moved, raise the shard-wide minimum, read the counters.
\set SHOW_CONTEXT never
CREATE EXTENSION shard_directory;
SET search_path = shard_directory, public;
SELECT min_accepted FROM shard_settings;

CREATE TABLE orders (tenant_id bigint NOT NULL, item text NOT NULL);
SELECT protect('orders', 'tenant_id', 'tenant');

-- the client sends its directory version with every transaction
BEGIN;
SELECT set_config('app.directory_version', '41', true);
INSERT INTO orders VALUES (8842, 'first order'), (17, 'other tenant');
COMMIT;

-- a write that sends no version is refused, retryably
INSERT INTO orders VALUES (8842, 'unversioned');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- tenant 8842 has moved to shard_2 at directory version 42
SELECT fence_moved('tenant', '8842', 'shard_2', 42);
SELECT entity_type, entity_id, state, min_version, moved_to FROM shard_fences;
BEGIN;
SELECT set_config('app.directory_version', '41', true);
UPDATE orders SET item = item || ' (edited)';
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- other tenants' writes go on
BEGIN;
SELECT set_config('app.directory_version', '41', true);
UPDATE orders SET item = item || ' (edited)' WHERE tenant_id = 17;
COMMIT;

-- a version that is not a number is a client bug: 22023, not retryable
BEGIN;
SELECT set_config('app.directory_version', 'abc', true);
SELECT assert_directory_version();
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- after every client has refreshed: raise the shard-wide minimum (it only rises)
SELECT raise_min_accepted(42);
SELECT raise_min_accepted(40);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
BEGIN;
SELECT set_config('app.directory_version', '41', true);
SELECT assert_directory_version();
ROLLBACK;

-- counters (this session's only: the library is not in shared_preload_libraries here)
SELECT reason, count FROM stats() ORDER BY reason;

-- the tables an entity type's rows live in: what the mover moves
SELECT * FROM protected_tables();

-- the mover's own path through a fence: one entity, for this transaction only
BEGIN;
SELECT set_config('app.directory_version', '42', true);
SELECT bypass_fence('tenant', '8842');
UPDATE orders SET item = item || ' (moved out)' WHERE tenant_id = 8842;
COMMIT;
BEGIN;
SELECT set_config('app.directory_version', '42', true);
INSERT INTO orders VALUES (8842, 'after that transaction');
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- and only for the roles it is granted to
CREATE ROLE regress_app_writer;
GRANT USAGE ON SCHEMA shard_directory TO regress_app_writer;
SET ROLE regress_app_writer;
SELECT bypass_fence('tenant', '8842');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
REVOKE USAGE ON SCHEMA shard_directory FROM regress_app_writer;
DROP ROLE regress_app_writer;

SELECT unprotect('orders');
SELECT tenant_id, item FROM orders ORDER BY tenant_id;

-- the check under a parallel-query setting: it is PARALLEL UNSAFE, so it runs, never fails
-- (16 renamed force_parallel_mode to debug_parallel_query)
SELECT CASE WHEN current_setting('server_version_num')::int >= 160000
            THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END AS parallel_setting \gset
SET :parallel_setting = on;
BEGIN;
SELECT set_config('app.directory_version', '100', true);
SELECT assert_directory_version();
COMMIT;
RESET :parallel_setting;
