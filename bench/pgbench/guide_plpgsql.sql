-- The guide's PL/pgSQL check, for comparison with the native one (installed by bench_check).
CREATE OR REPLACE FUNCTION public.guide_assert_directory_version() RETURNS void AS $$
DECLARE client_version bigint := current_setting('app.directory_version', true)::bigint;
BEGIN
  IF client_version IS NULL OR client_version < (SELECT min_accepted FROM shard_directory.shard_settings) THEN
    RAISE EXCEPTION 'stale shard directory (client %, minimum %)',
      client_version, (SELECT min_accepted FROM shard_directory.shard_settings)
      USING ERRCODE = '40001';
  END IF;
END $$ LANGUAGE plpgsql;
