//! Upgrades: `ALTER EXTENSION shard_directory UPDATE` from 0.1.0 (the first release) leaves the
//! same objects as a fresh install of the current version: the same members, columns, defaults,
//! constraints, indexes, triggers, functions, privileges and storage options.

use shard_directory_e2e::{column, Cluster};
use tokio_postgres::Client;

/// One line per property of every object the extension owns, sorted.
const DESCRIBE: &str = r#"
WITH ext AS (SELECT oid, extversion FROM pg_extension WHERE extname = 'shard_directory'),
     member AS (SELECT d.classid, d.objid FROM pg_depend d, ext
                 WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
                   AND d.deptype = 'e'),
     rel AS (SELECT c.oid, c.relname FROM pg_class c JOIN member m
                 ON m.classid = 'pg_class'::regclass AND m.objid = c.oid)
SELECT line FROM (
  SELECT 'version ' || extversion AS line FROM ext
  UNION ALL
  SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM member
  UNION ALL
  SELECT format('column %s.%s #%s %s not null %s default %s generated %s identity %s',
                r.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                pg_get_expr(ad.adbin, ad.adrelid), a.attgenerated, a.attidentity)
    FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
  UNION ALL
  SELECT format('constraint %s.%s %s', r.relname, co.conname, pg_get_constraintdef(co.oid))
    FROM rel r JOIN pg_constraint co ON co.conrelid = r.oid
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM rel r JOIN pg_index i ON i.indrelid = r.oid
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM rel r JOIN pg_trigger t ON t.tgrelid = r.oid
   WHERE NOT t.tgisinternal
  UNION ALL
  SELECT format('relation %s acl %s options %s', r.relname, c.relacl, c.reloptions)
    FROM rel r JOIN pg_class c ON c.oid = r.oid
  UNION ALL
  SELECT format('function %s returns %s volatile %s parallel %s strict %s secdef %s config %s acl %s body %s',
                p.oid::regprocedure, pg_get_function_result(p.oid), p.provolatile, p.proparallel,
                p.proisstrict, p.prosecdef, p.proconfig, p.proacl, md5(p.prosrc))
    FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
) lines ORDER BY line
"#;

async fn describe(c: &Client) -> Vec<String> {
    column(c, DESCRIBE, &[]).await
}

#[tokio::test]
async fn updating_from_0_1_0_gives_the_same_objects_as_a_fresh_install() {
    let cluster = Cluster::start("upgrade", &[]);
    cluster.create_database_with_extension("fresh").await;
    let admin = cluster.connect("postgres").await;
    admin
        .batch_execute("CREATE DATABASE upgraded")
        .await
        .unwrap();
    let upgraded = cluster.connect("upgraded").await;
    upgraded
        .batch_execute("CREATE EXTENSION shard_directory VERSION '0.1.0'")
        .await
        .expect("0.1.0 installs (scripts/install-extension.sh installs its script)");
    let before = describe(&upgraded).await;
    assert!(before.contains(&"version 0.1.0".to_owned()));
    // An application table protected under 0.1.0 (its row trigger ran BEFORE each row), and a
    // partitioned one protected without a key, as 0.1.0's `protect` left it: a statement trigger
    // on the table alone (made by hand: the 0.1.0 SQL calls this build's library).
    upgraded
        .batch_execute(
            "CREATE TABLE orders (tenant_id int, item text);
             SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');
             CREATE TABLE readings (device_id int, v int) PARTITION BY RANGE (device_id);
             CREATE TABLE readings_1 PARTITION OF readings FOR VALUES FROM (0) TO (100);
             CREATE TRIGGER shard_directory_protect
               BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON readings FOR EACH STATEMENT
               EXECUTE FUNCTION shard_directory.shard_directory_protect_statement();",
        )
        .await
        .unwrap();
    upgraded
        .batch_execute("ALTER EXTENSION shard_directory UPDATE")
        .await
        .expect("the upgrade script runs");
    let row_trigger: String = upgraded
        .query_one(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger \
             WHERE tgrelid = 'orders'::regclass AND tgname = 'shard_directory_protect_row'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        row_trigger.contains(" AFTER INSERT OR DELETE OR UPDATE ON public.orders FOR EACH ROW")
            && row_trigger.ends_with("shard_directory_protect_row('tenant_id', 'tenant')"),
        "{row_trigger}"
    );
    let partition_triggers: Vec<String> = column(
        &upgraded,
        "SELECT format('%s %s', tgname, CASE WHEN tgparentid = 0 THEN 'own' ELSE 'cloned' END) \
         FROM pg_trigger WHERE tgrelid = 'readings_1'::regclass ORDER BY tgname",
        &[],
    )
    .await;
    assert_eq!(
        partition_triggers,
        [
            "shard_directory_protect own",
            "shard_directory_protect_row own"
        ],
        "a partition of a table 0.1.0 protected without a key gets both triggers of its own \
         (the upgrade's event trigger gives them when the script alters its tables)"
    );
    let (fresh, upgraded) = (
        describe(&cluster.connect("fresh").await).await,
        describe(&upgraded).await,
    );
    let only_fresh: Vec<_> = fresh.iter().filter(|l| !upgraded.contains(l)).collect();
    let only_upgraded: Vec<_> = upgraded.iter().filter(|l| !fresh.contains(l)).collect();
    assert!(
        only_fresh.is_empty() && only_upgraded.is_empty(),
        "fresh install only:\n{only_fresh:#?}\nupgraded only:\n{only_upgraded:#?}"
    );
    assert_ne!(before, fresh, "the upgrade changed something");
    assert!(fresh
        .iter()
        .any(|l| l.starts_with("member table shard_directory.shard_moves")));
}
