-- A DBA's session on the directory database: register shards, add tenants, walk a move,
-- meet a refused step, ask where a tenant was.
\set SHOW_CONTEXT never
CREATE EXTENSION shard_directory;
SET search_path = shard_directory, public;

INSERT INTO shards (shard_name, region) VALUES
    ('shard_1', 'eu'), ('shard_2', 'eu'), ('shard_3', 'us');
-- where each shard is, for the mover: never with a password (.pgpass or PGPASSWORD hold it)
UPDATE shards SET conninfo = 'host=10.0.0.1 port=5432 dbname=app user=mover' WHERE shard_name = 'shard_1';
\set VERBOSITY terse
UPDATE shards SET conninfo = 'host=10.0.0.2 dbname=app user=mover password=secret' WHERE shard_name = 'shard_2';
\set VERBOSITY default
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT shard_name, region, conninfo FROM shards ORDER BY shard_name;
INSERT INTO shard_directory (entity_type, entity_id, shard_name, region) VALUES
    ('tenant', '8842', 'shard_1', 'eu'),
    ('tenant', '17',   'shard_2', 'eu');
-- one statement, one version, stamped on both rows; who and when are filled in
SELECT current_version();
SELECT entity_id, shard_name, state, target_shard, version, updated_by = current_user AS by_me
  FROM shard_directory ORDER BY entity_id;

-- the guide's bare re-point of an active tenant is refused: moves go through the states
UPDATE shard_directory SET shard_name = 'shard_2', version = version + 1
 WHERE entity_type = 'tenant' AND entity_id = '8842';
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- walk a move: each step returns the new version
SELECT begin_move('tenant', '8842', 'shard_2');
SELECT entity_id, shard_name, state, target_shard, version FROM shard_directory WHERE entity_id = '8842';
SELECT complete_move('tenant', '8842');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT freeze('tenant', '8842');
SELECT complete_move('tenant', '8842');
SELECT entity_id, shard_name, state, target_shard, version FROM shard_directory WHERE entity_id = '8842';

-- an unknown shard and a shard in another region
SELECT begin_move('tenant', '8842', 'shard_9');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT begin_move('tenant', '8842', 'shard_3');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT current_version();

-- a shard an entry names stays registered
DELETE FROM shards WHERE shard_name = 'shard_2';
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- a move that is called off
SELECT begin_move('tenant', '17', 'shard_1');
SELECT abort_move('tenant', '17');

-- history answers "which shard was tenant 8842 on?"
SELECT op, transition, old_shard, new_shard, old_state, new_state, new_target, version
  FROM shard_directory_history WHERE entity_id = '8842' ORDER BY history_id;
SELECT placement_at('tenant', '8842', now()) AS now_on;
SELECT placement_at('tenant', '8842', '2000-01-01') IS NULL AS unknown_in_2000;
UPDATE shard_directory_history SET new_shard = 'shard_3';
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
