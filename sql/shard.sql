-- Shard objects. The check, the locks and the cache live in Rust (src/shard/); this file only
-- declares the tables and wires the triggers that keep every change to them visible to the check.

-- The guide's singleton: requests with a directory version below min_accepted are refused.
CREATE TABLE shard_settings (
    id           bool        PRIMARY KEY DEFAULT true CHECK (id),
    min_accepted bigint      NOT NULL DEFAULT 0 CHECK (min_accepted >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO shard_settings DEFAULT VALUES;

-- Per-entity fences: one tenant's move never rejects other tenants' clients.
CREATE TABLE shard_fences (
    entity_type  text        NOT NULL,
    entity_id    text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('owned','frozen','cutover','moved')),
    min_version  bigint      NOT NULL DEFAULT 0 CHECK (min_version >= 0),
    moved_to     text,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- a frozen (or cutover) fence's lease: past it the fence governs as owned (min_version)
    lease_until  timestamptz CONSTRAINT shard_fences_lease_is_frozen
                             CHECK (lease_until IS NULL OR state IN ('frozen','cutover')),
    PRIMARY KEY (entity_type, entity_id),
    CHECK ((state = 'moved') = (moved_to IS NOT NULL))
);

CREATE TRIGGER shard_settings_guard
    BEFORE INSERT OR UPDATE OR DELETE ON shard_settings
    FOR EACH ROW EXECUTE FUNCTION shard_settings_guard();

CREATE TRIGGER shard_settings_no_truncate
    BEFORE TRUNCATE ON shard_settings
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_refuse_truncate();

CREATE TRIGGER shard_fences_changed
    BEFORE INSERT OR UPDATE OR DELETE ON shard_fences
    FOR EACH ROW EXECUTE FUNCTION shard_fences_changed();

CREATE TRIGGER shard_fences_no_truncate
    BEFORE TRUNCATE ON shard_fences
    FOR EACH STATEMENT EXECUTE FUNCTION shard_directory_refuse_truncate();

-- pg_dump carries min_accepted (a restore never lowers it) and the fences.
SELECT pg_catalog.pg_extension_config_dump('shard_settings', '');
SELECT pg_catalog.pg_extension_config_dump('shard_fences', '');

-- Partitions and inheritance children created or attached after protect(parent) get its
-- triggers too: the statement trigger, so a TRUNCATE made straight to one is checked, and (on
-- those that hold rows) the row trigger, with the key the parent's statement trigger carries
-- (none: protect(parent) without a key, for the shard-wide rule). However the table is made:
-- also inside CREATE SCHEMA (whose commands fire it as CREATE SCHEMA) and in a session with
-- session_replication_role = replica (a restore, a logical apply: ENABLE ALWAYS). SECURITY
-- DEFINER: the trigger functions are not PUBLIC, and the role adding a partition needs no grant.
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
