-- Directory database objects. The rules live in the Rust trigger functions (src/directory/);
-- this file only declares the tables and wires the triggers.

-- Entity ids are compared as UTF-8 text on both roles (src/entity.rs).
SELECT require_utf8_database();

-- Registry of shards: a typo'd shard name is an error, not an outage. conninfo says where the
-- shard is (libpq keywords or URI, never a password: libpq takes it from .pgpass or the
-- environment), so the mover and routers need only the directory's address.
CREATE TABLE shards (
    shard_name  text        PRIMARY KEY,
    region      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    conninfo    text        CONSTRAINT shards_conninfo_has_no_password CHECK (
                    conninfo !~* '(^|[\s?&])password\s*=' AND conninfo !~* '^postgres(ql)?://[^/@]*:[^/@]*@')
);

-- The guide's table, plus target_shard: where a migrating / read_only entry is going.
CREATE TABLE shard_directory (
    entity_type  text        NOT NULL,          -- 'tenant', 'account', 'region'
    entity_id    text        NOT NULL,
    shard_name   text        NOT NULL,
    region       text,
    state        text        NOT NULL DEFAULT 'active'
                             CHECK (state IN ('active','migrating','read_only')),
    target_shard text,
    version      bigint      NOT NULL DEFAULT 0, -- stamped by the trigger with the statement's version
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text        NOT NULL DEFAULT current_user,
    PRIMARY KEY (entity_type, entity_id)
);

CREATE INDEX shard_directory_shard_idx ON shard_directory (shard_name)
  WHERE state <> 'active';

-- One global version, bumped once by every statement that changes the directory. Its page
-- keeps each version of the row until pruned, and every read walks them: a low fillfactor has
-- the page pruned after a few dozen updates instead of a few hundred.
CREATE TABLE shard_directory_version (
    id          bool PRIMARY KEY DEFAULT true CHECK (id),
    version     bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Which history the versions belong to (docs/directory.md, "One history"): replaced by the
    -- first change a server makes that did not mint it (after a restart, a promotion, a restore).
    lineage     text NOT NULL DEFAULT '',
    lineage_minted_by text NOT NULL DEFAULT ''
) WITH (fillfactor = 10);
INSERT INTO shard_directory_version (version) VALUES (0);

-- Append-only: one row per inserted, updated or deleted entry.
CREATE TABLE shard_directory_history (
    history_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    op           text        NOT NULL CHECK (op IN ('insert','update','delete')),
    transition   text        NOT NULL,  -- insert, begin_move, freeze, cutover, abort, repoint, ...
    entity_type  text        NOT NULL,
    entity_id    text        NOT NULL,
    old_shard    text,
    new_shard    text,
    old_state    text,
    new_state    text,
    old_target   text,
    new_target   text,
    old_region   text,
    new_region   text,
    version      bigint      NOT NULL,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    changed_by   text        NOT NULL DEFAULT current_user,
    txid         bigint      NOT NULL DEFAULT txid_current(),
    -- when the statement took its version: increases with version (so with commit order),
    -- unlike changed_at (the transaction's start); placement_at reads it
    version_at   timestamptz NOT NULL
);

CREATE INDEX shard_directory_history_entity_version_idx
    ON shard_directory_history (entity_type, entity_id, version);

-- Routers ask "what changed since version N" (changes_since) through this index.
CREATE INDEX shard_directory_history_version_idx ON shard_directory_history (version);

-- What changed after version `since`, read in one snapshot with the version: the key of every
-- entry inserted, updated or deleted since, with the latest version that changed it. A router
-- keeps every other cached entry: one read after `since` with no change in history up to
-- `version` is still the entry at `version` (versions commit in order, and each change writes
-- its history row in its own transaction). complete is false when history does not hold every
-- version after `since` (purge_history removes the oldest versions first; a version bumped by a
-- direct write to the version row has no history row) or more than max_changes rows changed:
-- the caller then forgets everything it cached.
CREATE FUNCTION changes_since(
    since bigint, max_changes integer DEFAULT 10000,
    OUT version bigint, OUT age float8, OUT complete boolean,
    OUT entity_types text[], OUT entity_ids text[], OUT versions bigint[])
STABLE STRICT
-- Native (src/directory/changes.rs): every router's watcher calls this on every change. It reads
-- in the calling query's snapshot, with no statement (the version row where the last bump wrote
-- it, else by its key; history by its version index: a range bounded on both sides, then its
-- oldest entry), with the extension's rights over its own tables: EXECUTE (privileges.sql) is
-- what admits a caller.
LANGUAGE c AS 'MODULE_PATHNAME', 'changes_since_native';

-- Each shard's entities weighed by the mover for `drain`, `split` and `rebalance` (rows and
-- bytes, estimated: mover/src/sizes.rs), so that a plan made within --sizes-max-age of the
-- measure reads them here instead of scanning the shard again. A cache: pg_dump leaves it out.
CREATE TABLE shard_sizes (
    shard_name        text        PRIMARY KEY,
    -- {"<entity_type>": {"<entity_id>": [rows, bytes]}}
    sizes             jsonb       NOT NULL,
    measured_at       timestamptz NOT NULL DEFAULT now()
);

-- A plan of many moves run as one batch (`shard-directory move --from-file`): the plan as it was
-- run, and the state `batch pause`, `batch resume` and `batch abort` set and its runner obeys.
CREATE TABLE shard_move_batches (
    batch_id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    purpose           text        NOT NULL DEFAULT '',
    plan              jsonb       NOT NULL,
    parallel          integer     NOT NULL CHECK (parallel > 0),
    per_shard         integer     NOT NULL CHECK (per_shard > 0),
    -- How each of its moves is made (method, max_freeze, keep_source, reversible, ...), as the
    -- batch was started: `batch resume` starts the rest the same way.
    move_options      jsonb       NOT NULL,
    state             text        NOT NULL DEFAULT 'running' CHECK (state IN (
                          'running', 'paused', 'aborting', 'aborted', 'done')),
    started_by        text        NOT NULL DEFAULT current_user,
    started_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CHECK ((finished_at IS NOT NULL) = (state IN ('aborted', 'done')))
);

-- One row per move made by the mover (crate shard-directory-mover): where it stands, what it
-- saw, and what an abort must restore. The publication, slot and subscription of a logical move
-- are all named replication_name, derived from move_id so it is recorded before they exist.
CREATE TABLE shard_moves (
    move_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_type       text        NOT NULL,
    entity_id         text        NOT NULL,
    source_shard      text        NOT NULL,
    target_shard      text        NOT NULL,
    method            text        NOT NULL CHECK (method IN ('logical', 'copy')),
    phase             text        NOT NULL DEFAULT 'migrating' CHECK (phase IN (
                          'migrating', 'copying', 'catching_up', 'frozen', 'verified', 'cutover',
                          'cleaning_up', 'reversible', 'done', 'reverted', 'aborting',
                          'aborted')),
    keep_source       boolean     NOT NULL DEFAULT false,
    max_freeze        interval    NOT NULL,
    -- A revert's replication is the way back of the move it reverts, which that move made.
    replication_name  text        GENERATED ALWAYS AS (CASE WHEN reverses IS NULL
                                      THEN 'sd_move_' || move_id
                                      ELSE 'sd_move_' || reverses || '_back' END) STORED,
    source_fence      jsonb       NOT NULL,   -- the entity's fence on each side before the move
    target_fence      jsonb       NOT NULL,
    tables            jsonb       NOT NULL DEFAULT '{}',  -- per table: rows total, copied, deleted
    freeze_version    bigint,
    cutover_version   bigint,
    catchup_lsn       pg_lsn,     -- source WAL insert position taken after the freeze committed
    confirmed_lsn     pg_lsn,     -- the slot's confirmed position once it passed catchup_lsn
    freeze_started_at timestamptz,
    freeze_lease_until timestamptz, -- when a freeze no mover ended may be released (directory clock)
    max_freeze_seen   interval,
    last_error        text,
    started_by        text        NOT NULL DEFAULT current_user,
    started_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    -- The batch (shard_move_batches) it ran in, if any: not a foreign key, since a parallel
    -- pg_restore loads the two tables side by side (a reverted move is in this one).
    batch_id          bigint,
    -- --reversible: after the cutover, a replication of the entity's rows back to the source
    -- (sd_move_<id>_back) keeps them there, until finalize (or reversible_until) or a revert.
    reversible        boolean     NOT NULL DEFAULT false,
    reversible_for    interval,
    reversible_until  timestamptz,
    finalized_at      timestamptz,  -- finalize asked: the way back dropped, the source cleared
    reverses          bigint      REFERENCES shard_moves,  -- the reversible move this one takes back
    CHECK (source_shard <> target_shard),
    CHECK (NOT (reversible AND reverses IS NOT NULL)),
    CHECK ((finished_at IS NOT NULL) = (phase IN ('done', 'reverted', 'aborted')))
);

-- At most one open move per entity, a reversible one's revert aside.
CREATE UNIQUE INDEX shard_moves_open_idx ON shard_moves (entity_type, entity_id)
    WHERE finished_at IS NULL AND phase <> 'reversible';
CREATE INDEX shard_moves_batch_idx ON shard_moves (batch_id) WHERE batch_id IS NOT NULL;

-- Each move's new phase to the listeners of shard_directory_moves (a JSON object), at commit.
CREATE TRIGGER shard_moves_notify
    AFTER INSERT OR UPDATE OF phase ON shard_moves
    FOR EACH ROW EXECUTE FUNCTION shard_moves_notify();

-- Trigger order on shard_directory for one statement:
--   statement_begin (opens the statement; refuses it if a trigger below would not run),
--   guard (per row: state machine, shards, region, the version stamp the statement expects,
--   who/when), history (per changed row, once all are written: the first takes the version lock
--   and bumps; a row whose stamp was wrong is stamped again; its history row),
--   shard_directory_changed (notifies).
CREATE TRIGGER shard_directory_statement_begin
    BEFORE INSERT OR UPDATE OR DELETE ON shard_directory
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_statement_begin();
-- The statement trigger and the row guards fire with session_replication_role = replica too
-- (a logical replication worker's, or a superuser's session), where the others would not: they
-- refuse the write there instead of letting it skip every rule.
ALTER TABLE shard_directory ENABLE ALWAYS TRIGGER shard_directory_statement_begin;

CREATE TRIGGER shard_directory_guard
    BEFORE INSERT OR UPDATE OR DELETE ON shard_directory
    FOR EACH ROW EXECUTE FUNCTION shard_directory_guard();
ALTER TABLE shard_directory ENABLE ALWAYS TRIGGER shard_directory_guard;

CREATE TRIGGER shard_directory_history
    AFTER INSERT OR UPDATE OR DELETE ON shard_directory
    FOR EACH ROW EXECUTE FUNCTION shard_directory_record_history();

CREATE TRIGGER shard_directory_changed
    AFTER INSERT OR UPDATE OR DELETE ON shard_directory
    FOR EACH STATEMENT EXECUTE FUNCTION notify_directory_change();

CREATE TRIGGER shard_directory_no_truncate
    BEFORE TRUNCATE ON shard_directory
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_refuse_truncate();

CREATE TRIGGER shard_directory_version_guard
    BEFORE INSERT OR UPDATE OR DELETE ON shard_directory_version
    FOR EACH ROW EXECUTE FUNCTION shard_directory_version_guard();
ALTER TABLE shard_directory_version ENABLE ALWAYS TRIGGER shard_directory_version_guard;

CREATE TRIGGER shard_directory_version_no_truncate
    BEFORE TRUNCATE ON shard_directory_version
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_refuse_truncate();

-- shards_guard and the entries' guard keep a named shard registered and regions matched
-- (src/directory/registry.rs): rules, not foreign keys, so that a parallel pg_restore, which
-- loads these tables side by side, keeps every row.
CREATE TRIGGER shards_guard
    BEFORE UPDATE OR DELETE ON shards
    FOR EACH ROW EXECUTE FUNCTION shards_guard();

CREATE TRIGGER shard_directory_history_guard
    BEFORE INSERT OR UPDATE OR DELETE ON shard_directory_history
    FOR EACH ROW EXECUTE FUNCTION shard_directory_history_guard();
ALTER TABLE shard_directory_history ENABLE ALWAYS TRIGGER shard_directory_history_guard;

-- A publication that would carry the directory's tables to a logical copy is refused where the
-- DBA makes it (check_publications(), src/directory/replica.rs; docs/directory.md, "Read
-- copies"), in every session_replication_role: the publications the command made or changed,
-- checked with the owner's rights (any role with CREATE on the database may publish its own
-- tables). Those made before the extension are checked as it is made.
CREATE FUNCTION refuse_directory_publication() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM shard_directory.check_publications(ARRAY(
        SELECT CASE c.classid
                   WHEN 'pg_publication'::regclass THEN c.objid
                   WHEN 'pg_publication_rel'::regclass THEN r.prpubid
                   ELSE n.pnpubid
               END
          FROM pg_event_trigger_ddl_commands() c
          LEFT JOIN pg_publication_rel r
                 ON c.classid = 'pg_publication_rel'::regclass AND r.oid = c.objid
          LEFT JOIN pg_publication_namespace n
                 ON c.classid = 'pg_publication_namespace'::regclass AND n.oid = c.objid
         WHERE c.classid IN ('pg_publication'::regclass, 'pg_publication_rel'::regclass,
                             'pg_publication_namespace'::regclass)));
END
$$;
REVOKE EXECUTE ON FUNCTION refuse_directory_publication() FROM PUBLIC;
CREATE EVENT TRIGGER shard_directory_refuse_publication ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
    EXECUTE FUNCTION refuse_directory_publication();
ALTER EVENT TRIGGER shard_directory_refuse_publication ENABLE ALWAYS;
SELECT check_publications();

CREATE TRIGGER shard_directory_history_no_truncate
    BEFORE TRUNCATE ON shard_directory_history
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_refuse_truncate();

-- pg_dump carries the directory: a restore keeps entries (with their versions), the version
-- (never lower than a restored entry's), history and moves. See the guard triggers for how the
-- table owner's restore is told apart from a writer's change.
SELECT pg_catalog.pg_extension_config_dump('shards', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_version', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_history', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_history_history_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('shard_moves', '');
SELECT pg_catalog.pg_extension_config_dump('shard_moves_move_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('shard_move_batches', '');
SELECT pg_catalog.pg_extension_config_dump('shard_move_batches_batch_id_seq', '');
