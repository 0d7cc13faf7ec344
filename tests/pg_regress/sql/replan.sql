-- The directory's write path keeps its statements prepared for the session. Dropping and
-- creating the extension again in the same session must not leave them pointing at the old
-- tables: the shard lookup, the history row and the version bump all follow the new ones.
\set SHOW_CONTEXT never
\set VERBOSITY terse
CREATE EXTENSION shard_directory;
SET search_path = shard_directory, public;
INSERT INTO shards (shard_name) VALUES ('shard_1');
INSERT INTO shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '1', 'shard_1');
UPDATE shard_directory SET region = 'eu';
SELECT version FROM shard_directory_version;

DROP EXTENSION shard_directory CASCADE;
CREATE EXTENSION shard_directory;
-- the new registry puts shard_1 in 'eu': the cached shard lookup must read it
INSERT INTO shards (shard_name, region) VALUES ('shard_1', 'eu');
INSERT INTO shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '1', 'shard_1');
UPDATE shard_directory SET region = 'us';
UPDATE shard_directory SET region = 'eu';
SELECT version FROM shard_directory_version;
SELECT op, transition, old_region, new_region, version FROM shard_directory_history ORDER BY version;
