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
    id          bool PRIMARY KEY DEFAULT true CHECK (id),
    version     bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO public.shard_directory_version (version) VALUES (0);

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

-- The guide's trigger plus the extension's rules written in PL/pgSQL, so that native and
-- PL/pgSQL are compared doing the same work: the shard and its region checked, the entry stamped
-- with the new version (who, when), a history row like the extension's (same table shape and
-- indexes), then the notification.
CREATE TABLE public.rules_directory (LIKE shard_directory.shard_directory INCLUDING ALL);
INSERT INTO public.rules_directory SELECT * FROM shard_directory.shard_directory;
CREATE TABLE public.rules_version (LIKE public.shard_directory_version INCLUDING ALL);
INSERT INTO public.rules_version (version) VALUES (0);
CREATE TABLE public.rules_history (LIKE shard_directory.shard_directory_history INCLUDING ALL);

CREATE FUNCTION public.rules_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  shard_region text;
BEGIN
  SELECT region INTO shard_region FROM shard_directory.shards WHERE shard_name = NEW.shard_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'unknown shard %', NEW.shard_name USING ERRCODE = 'foreign_key_violation';
  END IF;
  IF shard_region IS NOT NULL AND NEW.region IS DISTINCT FROM shard_region THEN
    RAISE EXCEPTION 'region % is not shard %''s', NEW.region, NEW.shard_name;
  END IF;
  IF NEW.shard_name <> OLD.shard_name AND NEW.state = OLD.state THEN
    RAISE EXCEPTION 'a re-point goes through a move' USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  UPDATE public.rules_version SET version = version + 1, updated_at = clock_timestamp()
    RETURNING version INTO NEW.version;
  NEW.updated_at := now();
  NEW.updated_by := current_user;
  RETURN NEW;
END $$;

CREATE FUNCTION public.rules_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.rules_history (op, transition, entity_type, entity_id, old_shard, new_shard,
      old_state, new_state, old_target, new_target, old_region, new_region, version, version_at)
    VALUES ('update', 'update', NEW.entity_type, NEW.entity_id, OLD.shard_name, NEW.shard_name,
      OLD.state, NEW.state, OLD.target_shard, NEW.target_shard, OLD.region, NEW.region,
      NEW.version, clock_timestamp());
  RETURN NULL;
END $$;

CREATE FUNCTION public.rules_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('shard_directory_rules', (SELECT version::text FROM public.rules_version));
  RETURN NULL;
END $$;

CREATE TRIGGER rules_guard BEFORE UPDATE ON public.rules_directory
  FOR EACH ROW EXECUTE FUNCTION public.rules_guard();
CREATE TRIGGER rules_history AFTER UPDATE ON public.rules_directory
  FOR EACH ROW EXECUTE FUNCTION public.rules_history();
CREATE TRIGGER rules_notify AFTER UPDATE ON public.rules_directory
  FOR EACH STATEMENT EXECUTE FUNCTION public.rules_notify();
