-- A one-row INSERT transaction stamped as the client stamps it, into a table that is not
-- protected: the baseline of insert_protected.sql.
\set tenant random(1, 10000)
BEGIN;
SELECT set_config('app.directory_version', '42', true), set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', :tenant::text, true);
INSERT INTO orders_plain (tenant_id, item) VALUES (:tenant, 'item');
END;
