-- Two entries' regions change in one transaction, one statement each, among 50 hot entries:
-- writers whose pairs overlap wait for each other's rows, always in one order (id, id + 1).
\set id random(1, 50)
BEGIN;
UPDATE public.plain_directory SET region = CASE WHEN region = 'a' THEN 'b' ELSE 'a' END
    WHERE entity_type = 'tenant' AND entity_id = :id::text;
UPDATE public.plain_directory SET region = CASE WHEN region = 'a' THEN 'b' ELSE 'a' END
    WHERE entity_type = 'tenant' AND entity_id = (:id + 1)::text;
COMMIT;
