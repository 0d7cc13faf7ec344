-- bench_directory's three directories of 10,000 tenants, side by side in one database: the
-- extension's, a plain table (no trigger), and the guide's (its version table and its
-- statement trigger, verbatim).
INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1');
INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
    SELECT 'tenant', g::text, 'shard_1' FROM generate_series(1, 10000) g;

CREATE TABLE public.plain_directory (LIKE shard_directory.shard_directory INCLUDING ALL);
INSERT INTO public.plain_directory SELECT * FROM shard_directory.shard_directory;

CREATE TABLE public.guide_directory (LIKE shard_directory.shard_directory INCLUDING ALL);
INSERT INTO public.guide_directory SELECT * FROM shard_directory.shard_directory;
CREATE TABLE public.shard_directory_version (
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO public.shard_directory_version VALUES (0);

-- the notification, emitted by the same transaction that changes the mapping
CREATE OR REPLACE FUNCTION notify_directory_change() RETURNS trigger AS $$
BEGIN
  UPDATE shard_directory_version SET version = version + 1, updated_at = now();
  PERFORM pg_notify('shard_directory', (SELECT version::text FROM shard_directory_version));
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER shard_directory_changed
AFTER INSERT OR UPDATE OR DELETE ON guide_directory
FOR EACH STATEMENT EXECUTE FUNCTION notify_directory_change();
