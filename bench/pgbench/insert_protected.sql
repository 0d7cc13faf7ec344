-- The same transaction as insert_plain.sql into a table protect('orders_protected', 'tenant_id',
-- 'tenant') guards: its statement trigger checks the version and the declared entity, its row
-- trigger the row's tenant against its fence.
\set tenant random(1, 10000)
BEGIN;
SELECT set_config('app.directory_version', '42', true), set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', :tenant::text, true);
INSERT INTO orders_protected (tenant_id, item) VALUES (:tenant, 'item');
END;
