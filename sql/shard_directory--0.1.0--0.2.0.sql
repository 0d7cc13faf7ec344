-- shard_directory 0.1.0 -> 0.2.0: the mover's objects.
-- Run by ALTER EXTENSION shard_directory UPDATE; leaves the same objects as a fresh install of
-- 0.2.0 (e2e/tests/suite/upgrade.rs compares them).

-- Entity ids are compared as UTF-8 text on both roles (src/entity.rs).
CREATE FUNCTION "require_utf8_database"() RETURNS void
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'require_utf8_database_wrapper';
SELECT require_utf8_database();

-- The version row's page is pruned after a few dozen updates instead of a few hundred: every
-- read of the row walks the versions its page still keeps.
ALTER TABLE shard_directory_version SET (fillfactor = 10);

-- Where each shard is, for the mover and routers.
ALTER TABLE shards ADD COLUMN conninfo text CONSTRAINT shards_conninfo_has_no_password CHECK (
    conninfo !~* '(^|[\s?&])password\s*=' AND conninfo !~* '^postgres(ql)?://[^/@]*:[^/@]*@');

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
CREATE FUNCTION "shard_moves_notify"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'shard_moves_notify_wrapper';
-- Each move's new phase to the listeners of shard_directory_moves (a JSON object), at commit.
CREATE TRIGGER shard_moves_notify
    AFTER INSERT OR UPDATE OF phase ON shard_moves
    FOR EACH ROW EXECUTE FUNCTION shard_moves_notify();

-- The tables an entity type's rows live in: those protected with
-- protect(tbl, key_column, entity_type). The mover moves exactly these.
CREATE FUNCTION protected_tables()
RETURNS TABLE (tbl regclass, key_column text, entity_type text)
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- tgargs holds each argument followed by a zero byte: key_column, entity_type.
    SELECT t.tgrelid::regclass,
           convert_from(substring(t.tgargs FROM 1 FOR z.at - 1), 'UTF8'),
           convert_from(substring(t.tgargs FROM z.at + 1 FOR octet_length(t.tgargs) - z.at - 1), 'UTF8')
    FROM pg_trigger t
    CROSS JOIN LATERAL (SELECT position(decode('00', 'hex') IN t.tgargs) AS at) z
    -- The statement trigger of the table protect() was given, not those of its partitions.
    WHERE t.tgfoid = 'shard_directory.shard_directory_protect_statement()'::regprocedure
      AND t.tgnargs = 2
    ORDER BY 1
$$;

-- The mover's way through a fence (src/shard/bypass.rs).
CREATE  FUNCTION "bypass_fence"(
	"entity_type" TEXT, /* Option < & str > */
	"entity_id" TEXT /* Option < & str > */
) RETURNS void
VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'bypass_fence_wrapper';

-- History is ordered by version; version_at is when each version was taken (src/directory/version.rs).
-- Rows written before 0.2.0 get their transaction's start, the best time they recorded.
ALTER TABLE shard_directory_history ADD COLUMN version_at timestamptz;
ALTER TABLE shard_directory_history DISABLE TRIGGER shard_directory_history_guard;
UPDATE shard_directory_history SET version_at = changed_at;
ALTER TABLE shard_directory_history ENABLE TRIGGER shard_directory_history_guard;
ALTER TABLE shard_directory_history ALTER COLUMN version_at SET NOT NULL;
DROP INDEX shard_directory_history_entity_idx;
CREATE INDEX shard_directory_history_entity_version_idx
    ON shard_directory_history (entity_type, entity_id, version);

-- Routers ask "what changed since version N" (changes_since) through this index.
CREATE INDEX shard_directory_history_version_idx ON shard_directory_history (version);

-- What changed after version `since`, read in one snapshot with the version: the key of every
-- entry inserted, updated or deleted since, with the latest version that changed it. A router
-- keeps every other cached entry: one read after `since` with no change in history up to
-- `version` is still the entry at `version` (versions commit in order, and each change writes
-- its history row in its own transaction). complete is false when history may no longer cover
-- `since` (purge_history removes the oldest versions first) or more than max_changes rows
-- changed: the caller then forgets everything it cached.
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

-- Which history the directory's versions belong to: a new value once a restored or promoted
-- copy changes the directory (src/directory/epoch.rs). Clients read it with every version.
ALTER TABLE shard_directory_version
    ADD COLUMN lineage text NOT NULL DEFAULT '',
    ADD COLUMN lineage_minted_by text NOT NULL DEFAULT '';
CREATE FUNCTION "directory_epoch"() RETURNS text
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'directory_epoch_wrapper';

-- A shard stays registered while an entry or an open move names it, and its region change is
-- checked against the entries placed on it (src/directory/registry.rs): rules, not foreign
-- keys, so that a parallel pg_restore, which loads these tables side by side, keeps every row.
ALTER TABLE shard_directory DROP CONSTRAINT shard_directory_shard_name_fkey,
                            DROP CONSTRAINT shard_directory_target_shard_fkey;
CREATE FUNCTION "shards_guard"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'shards_guard_wrapper';
CREATE TRIGGER shards_guard
    BEFORE UPDATE OR DELETE ON shards
    FOR EACH ROW EXECUTE FUNCTION shards_guard();

-- pg_dump carries the directory's and the shard's state.
SELECT pg_catalog.pg_extension_config_dump('shards', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_version', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_history', '');
SELECT pg_catalog.pg_extension_config_dump('shard_directory_history_history_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('shard_moves', '');
SELECT pg_catalog.pg_extension_config_dump('shard_moves_move_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('shard_move_batches', '');
SELECT pg_catalog.pg_extension_config_dump('shard_move_batches_batch_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('shard_settings', '');
SELECT pg_catalog.pg_extension_config_dump('shard_fences', '');

-- Partitions and inheritance children created or attached after protect(parent) get its
-- triggers too: the statement trigger, so a TRUNCATE made straight to one is checked, and (on
-- those that hold rows) the row trigger, with the key the parent's statement trigger carries
-- (none: protect(parent) without a key, for the shard-wide rule). However the table is made:
-- also inside CREATE SCHEMA (whose commands fire it as CREATE SCHEMA) and in a session with
-- session_replication_role = replica (a restore, a logical apply: ENABLE ALWAYS). SECURITY
-- DEFINER: the trigger functions are not PUBLIC, and the role adding a partition needs no grant.
CREATE FUNCTION "check_inherited_keys"() RETURNS void
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_inherited_keys_wrapper';

CREATE FUNCTION protect_new_partitions() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    part regclass;
    args text;
BEGIN
    -- A table under tables protected with different keys is refused (one row trigger checks
    -- its rows for one entity type).
    PERFORM shard_directory.check_inherited_keys();
    FOR part IN
        WITH RECURSIVE tree (root, relid) AS (
            SELECT t.tgrelid, t.tgrelid FROM pg_trigger t
             WHERE t.tgfoid = 'shard_directory.shard_directory_protect_statement()'::regprocedure
            UNION
            SELECT tree.root, i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid
        )
        SELECT DISTINCT tree.relid::regclass
          FROM tree
         WHERE tree.relid <> tree.root
           AND NOT EXISTS (SELECT 1 FROM pg_trigger x
                            WHERE x.tgrelid = tree.relid AND x.tgname = 'shard_directory_protect')
    LOOP
        EXECUTE format('CREATE TRIGGER shard_directory_protect '
                       'BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT '
                       'EXECUTE FUNCTION shard_directory.shard_directory_protect_statement()', part);
    END LOOP;
    FOR part, args IN
        WITH RECURSIVE tree (root, relid) AS (
            SELECT t.tgrelid, t.tgrelid FROM pg_trigger t
             WHERE t.tgfoid = 'shard_directory.shard_directory_protect_statement()'::regprocedure
            UNION
            SELECT tree.root, i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid
        )
        SELECT tree.relid::regclass,
               coalesce(max(format('%L, %L', p.key_column, p.entity_type))
                            FILTER (WHERE p.tbl IS NOT NULL), '')
          FROM tree
          LEFT JOIN shard_directory.protected_tables() p ON p.tbl = tree.root
         WHERE tree.relid <> tree.root
           AND (SELECT c.relkind FROM pg_class c WHERE c.oid = tree.relid) = 'r'
           AND NOT EXISTS (SELECT 1 FROM pg_trigger x
                            WHERE x.tgrelid = tree.relid AND x.tgname = 'shard_directory_protect_row')
         GROUP BY tree.relid
    LOOP
        EXECUTE format('CREATE TRIGGER shard_directory_protect_row '
                       'AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW '
                       'EXECUTE FUNCTION shard_directory.shard_directory_protect_row(%s)', part, args);
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION protect_new_partitions() FROM PUBLIC;

CREATE EVENT TRIGGER shard_directory_protect_partitions ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE SCHEMA')
    EXECUTE FUNCTION protect_new_partitions();
ALTER EVENT TRIGGER shard_directory_protect_partitions ENABLE ALWAYS;

-- A frozen (or cutover) fence's lease, and the cutover's fence (src/shard/cached.rs).
ALTER TABLE shard_fences DROP CONSTRAINT shard_fences_state_check,
    ADD CONSTRAINT shard_fences_state_check CHECK (state IN ('owned','frozen','cutover','moved'));
ALTER TABLE shard_fences ADD COLUMN lease_until timestamptz CONSTRAINT shard_fences_lease_is_frozen
    CHECK (lease_until IS NULL OR state IN ('frozen','cutover'));

-- A freeze for a lease only (src/shard/fences.rs).
CREATE FUNCTION "fence_frozen"(
	"entity_type" TEXT,
	"entity_id" TEXT,
	"lease" interval,
	"freeze_version" bigint
) RETURNS void
VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fence_frozen_for_wrapper';

-- A cutover being committed: reads refused too, for a lease (src/shard/fences.rs).
CREATE FUNCTION "fence_cutover"(
	"entity_type" TEXT,
	"entity_id" TEXT,
	"lease" interval,
	"cutover_version" bigint
) RETURNS void
VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fence_cutover_wrapper';

-- A freeze whose lease ran out with no cutover, released (src/directory/moves.rs).
CREATE FUNCTION "release_expired_freeze"(
	"entity_type" TEXT,
	"entity_id" TEXT
) RETURNS bigint
VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_expired_freeze_wrapper';

-- The check for a transaction that only reads: a frozen entity is let through
-- (src/shard/check.rs).
CREATE FUNCTION "assert_directory_version"(
	"reading" bool
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'assert_directory_version_for_wrapper';

-- The canonical text of an entity id as a key of a protected table (src/shard/key.rs).
CREATE FUNCTION "canonical_entity_id"(
	"tbl" regclass,
	"entity_id" TEXT
) RETURNS TEXT
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'canonical_entity_id_wrapper';

-- A target's sequence put past the source's, locked against nextval (src/shard/sequences.rs).
CREATE FUNCTION "advance_sequence"(
	"seq" regclass,
	"past" bigint
) RETURNS bigint
VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'advance_sequence_wrapper';

-- Each entity's checked transactions over a window, busiest first (src/shard/load.rs).
CREATE FUNCTION "entity_stats"(
	"top" INT DEFAULT 20
) RETURNS TABLE (
	"entity_type" TEXT,
	"entity_id" TEXT,
	"transactions" bigint,
	"per_second" double precision,
	"since" timestamp with time zone
)
STRICT VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'entity_stats_wrapper';

-- Who may run what (sql/privileges.sql).
REVOKE EXECUTE ON FUNCTION
    shard_directory_statement_begin(),
    shard_directory_guard(),
    shard_directory_record_history(),
    notify_directory_change(),
    shard_directory_refuse_truncate(),
    shard_directory_version_guard(),
    shard_directory_history_guard(),
    shards_guard(),
    shard_moves_notify(),
    shard_settings_guard(),
    shard_fences_changed(),
    shard_directory_protect_statement(),
    shard_directory_protect_row(),
    raise_min_accepted(bigint),
    fence_owned(text, text, bigint),
    fence_frozen(text, text),
    fence_frozen(text, text, interval, bigint),
    fence_cutover(text, text, interval, bigint),
    fence_moved(text, text, text, bigint),
    unfence(text, text),
    protect(regclass),
    protect(regclass, text, text),
    unprotect(regclass),
    purge_history(timestamptz),
    release_expired_freeze(text, text),
    bypass_fence(text, text),
    advance_sequence(regclass, bigint),
    changes_since(bigint, integer),
    stats(),
    entity_stats(integer)
FROM PUBLIC;
-- The check's counts name the busiest entities and their rates: for monitoring roles.
GRANT EXECUTE ON FUNCTION stats(), entity_stats(integer) TO pg_monitor;


-- The check reads the latest committed fences, which a parallel operation cannot.
ALTER FUNCTION assert_directory_version() PARALLEL UNSAFE;

-- The statement trigger and the row guards fire with session_replication_role = replica too
-- (a logical replication worker's, or a superuser's session), where the others would not: they
-- refuse the write there instead of letting it skip every rule.
ALTER TABLE shard_directory ENABLE ALWAYS TRIGGER shard_directory_statement_begin;
ALTER TABLE shard_directory ENABLE ALWAYS TRIGGER shard_directory_guard;
ALTER TABLE shard_directory_version ENABLE ALWAYS TRIGGER shard_directory_version_guard;
ALTER TABLE shard_directory_history ENABLE ALWAYS TRIGGER shard_directory_history_guard;

CREATE FUNCTION "check_publications"(
	"publications" oid[] DEFAULT NULL
) RETURNS void
VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_publications_wrapper';

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

-- Each table 0.1.0 protected with a key, protected again as 0.2.0 protects: the key on its
-- statement trigger (where protected_tables() reads it), the row trigger AFTER each row (keys
-- filled by BEFORE triggers and generated columns are what it checks) and on each partition
-- rather than cloned from a partitioned table's. 0.1.0 kept the key on the row trigger.
DO $upgrade$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgrelid::regclass AS tbl,
               convert_from(substring(tg.tgargs FROM 1 FOR z.at - 1), 'UTF8') AS key_column,
               convert_from(substring(tg.tgargs FROM z.at + 1 FOR octet_length(tg.tgargs) - z.at - 1),
                            'UTF8') AS entity_type
          FROM pg_catalog.pg_trigger tg
         CROSS JOIN LATERAL (SELECT position(decode('00', 'hex') IN tg.tgargs) AS at) z
         WHERE tg.tgfoid = 'shard_directory.shard_directory_protect_row()'::regprocedure
           AND tg.tgparentid = 0 AND tg.tgnargs = 2
    LOOP
        PERFORM shard_directory.protect(t.tbl, t.key_column, t.entity_type);
    END LOOP;
END
$upgrade$;
