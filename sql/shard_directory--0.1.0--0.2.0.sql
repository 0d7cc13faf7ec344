-- shard_directory 0.1.0 -> 0.2.0: the mover's objects.
-- Run by ALTER EXTENSION shard_directory UPDATE; leaves the same objects as a fresh install of
-- 0.2.0 (tests/tests/upgrade.rs compares them).

-- Where each shard is, for the mover and routers.
ALTER TABLE shards ADD COLUMN conninfo text CONSTRAINT shards_conninfo_has_no_password CHECK (
    conninfo !~* '(^|[\s?&])password\s*=' AND conninfo !~* '^postgres(ql)?://[^/@]*:[^/@]*@');

-- One row per move made by the mover (crate shard-directory-mover): where it stands, what it
-- saw, and what an abort must restore. The publication, slot and subscription of a logical move
-- are all named replication_name, derived from move_id so it is recorded before they exist.
CREATE TABLE shard_moves (
    move_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_type       text        NOT NULL,
    entity_id         text        NOT NULL,
    source_shard      text        NOT NULL REFERENCES shards (shard_name),
    target_shard      text        NOT NULL REFERENCES shards (shard_name),
    method            text        NOT NULL CHECK (method IN ('logical', 'copy')),
    phase             text        NOT NULL DEFAULT 'migrating' CHECK (phase IN (
                          'migrating', 'copying', 'catching_up', 'frozen', 'verified', 'cutover',
                          'cleaning_up', 'done', 'aborting', 'aborted')),
    keep_source       boolean     NOT NULL DEFAULT false,
    max_freeze        interval    NOT NULL,
    replication_name  text        GENERATED ALWAYS AS ('sd_move_' || move_id) STORED,
    source_fence      jsonb       NOT NULL,   -- the entity's fence on each side before the move
    target_fence      jsonb       NOT NULL,
    tables            jsonb       NOT NULL DEFAULT '{}',  -- per table: rows total, copied, deleted
    freeze_version    bigint,
    cutover_version   bigint,
    catchup_lsn       pg_lsn,     -- source WAL insert position taken after the freeze committed
    confirmed_lsn     pg_lsn,     -- the slot's confirmed position once it passed catchup_lsn
    freeze_started_at timestamptz,
    max_freeze_seen   interval,
    last_error        text,
    started_by        text        NOT NULL DEFAULT current_user,
    started_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CHECK (source_shard <> target_shard),
    CHECK ((finished_at IS NOT NULL) = (phase IN ('done', 'aborted')))
);

-- At most one open move per entity.
CREATE UNIQUE INDEX shard_moves_open_idx ON shard_moves (entity_type, entity_id)
    WHERE finished_at IS NULL;

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
    WHERE t.tgfoid = 'shard_directory.shard_directory_protect_row()'::regprocedure
      AND t.tgnargs = 2
      AND t.tgparentid = 0  -- not the clones on partitions
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

REVOKE EXECUTE ON FUNCTION shard_directory.bypass_fence(text, text) FROM PUBLIC;
