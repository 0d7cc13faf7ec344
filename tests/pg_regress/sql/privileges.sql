-- Roles and grants, exactly as README "Roles and grants" gives them, tried by each role:
-- a directory writer holds privileges on shard_directory alone; a DBA is granted the admin
-- functions; an application role on a shard holds nothing on the extension's tables.
\set SHOW_CONTEXT never
\set VERBOSITY terse
CREATE EXTENSION shard_directory;
SET search_path = shard_directory, public;
CREATE ROLE sd_regress_writer;
CREATE ROLE sd_regress_dba;
CREATE ROLE sd_regress_app;

-- the directory writer
GRANT USAGE ON SCHEMA shard_directory TO sd_regress_writer;
GRANT SELECT, INSERT, UPDATE, DELETE ON shard_directory.shard_directory TO sd_regress_writer;
-- the DBA: a writer who also purges history and may re-point in an emergency
GRANT sd_regress_writer TO sd_regress_dba;
GRANT SELECT, INSERT, UPDATE ON shard_directory.shards TO sd_regress_dba;
GRANT SELECT ON shard_directory.shard_directory_history TO sd_regress_dba;
GRANT EXECUTE ON FUNCTION shard_directory.purge_history(timestamptz) TO sd_regress_dba;
GRANT SET ON PARAMETER shard_directory.allow_repoint TO sd_regress_dba;
-- the shard's application role and its DBA
GRANT USAGE ON SCHEMA shard_directory TO sd_regress_app;
GRANT USAGE, CREATE ON SCHEMA public TO sd_regress_app;
GRANT EXECUTE ON FUNCTION shard_directory.protect(regclass, text, text) TO sd_regress_app;
GRANT EXECUTE ON FUNCTION shard_directory.raise_min_accepted(bigint),
                          shard_directory.fence_frozen(text, text) TO sd_regress_dba;

INSERT INTO shards (shard_name, region) VALUES ('shard_1', 'eu'), ('shard_2', 'eu');

-- The writer adds, edits, moves and deletes entries: version, history and notification are
-- written on its behalf.
SET ROLE sd_regress_writer;
INSERT INTO shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', '8842', 'shard_1');
SELECT begin_move('tenant', '8842', 'shard_2');
SELECT abort_move('tenant', '8842');
SELECT current_version();
-- ...and can forge none of it
UPDATE shard_directory_version SET version = 9223372036854775807;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
INSERT INTO shard_directory_history (op, transition, entity_type, entity_id, version, version_at)
VALUES ('insert', 'insert', 'tenant', 'forged', 1, now());
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT purge_history(now());
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SET shard_directory.allow_repoint = on;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- nor borrow a trigger function of the extension for a table of its own
CREATE TEMP TABLE mine (id bool PRIMARY KEY, min_accepted bigint);
CREATE TRIGGER t BEFORE UPDATE ON mine FOR EACH ROW EXECUTE FUNCTION shard_directory.shard_settings_guard();
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT raise_min_accepted(10);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
SELECT op, transition, new_state, version, changed_by FROM shard_directory_history ORDER BY version;

-- The DBA re-points in an emergency (granted SET on the parameter) and purges history.
SET ROLE sd_regress_dba;
BEGIN;
SET LOCAL shard_directory.allow_repoint = on;
UPDATE shard_directory SET shard_name = 'shard_2' WHERE entity_id = '8842';
COMMIT;
SELECT entity_id, shard_name, state, version, updated_by FROM shard_directory;
SELECT transition, old_shard, new_shard, changed_by FROM shard_directory_history WHERE version = 4;
SELECT purge_history(now() + interval '1 minute');
RESET ROLE;

-- On a shard: the application role protects and writes its own table with no grant on the
-- extension's tables; a stale write is refused all the same.
SELECT raise_min_accepted(5);
SET ROLE sd_regress_app;
CREATE TABLE public.orders (tenant_id bigint NOT NULL, item text NOT NULL);
SELECT protect('public.orders', 'tenant_id', 'tenant');
BEGIN;
SELECT set_config('app.directory_version', '5', true);
INSERT INTO public.orders VALUES (8842, 'checked without any grant');
COMMIT;
BEGIN;
SELECT set_config('app.directory_version', '4', true);
INSERT INTO public.orders VALUES (8842, 'stale');
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM shard_settings;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT fence_frozen('tenant', '8842');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
-- the shard's DBA fences with EXECUTE alone
SET ROLE sd_regress_dba;
SELECT fence_frozen('tenant', '8842');
RESET ROLE;
-- a TRUNCATE would wipe the frozen tenant's rows
BEGIN;
SELECT set_config('app.directory_version', '5', true);
TRUNCATE public.orders;
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- A fresh session that sets allow_repoint before the library is loaded gains nothing.
\c
SET ROLE sd_regress_writer;
BEGIN;
SET LOCAL shard_directory.allow_repoint = on;
UPDATE shard_directory.shard_directory SET shard_name = 'shard_1' WHERE entity_id = '8842';
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;

DROP TABLE public.orders;
REVOKE ALL ON SCHEMA public FROM sd_regress_app;
DROP OWNED BY sd_regress_writer, sd_regress_dba, sd_regress_app;
DROP ROLE sd_regress_writer, sd_regress_dba, sd_regress_app;
