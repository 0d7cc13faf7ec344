-- One entry's region changes (always: a no-op UPDATE would be skipped by the extension).
\set id random(1, 10000)
UPDATE public.guide_directory SET region = CASE WHEN region = 'a' THEN 'b' ELSE 'a' END
    WHERE entity_type = 'tenant' AND entity_id = :id::text;
