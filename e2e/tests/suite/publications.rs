//! A logical copy of the directory is refused: a publication that would carry its tables where
//! the DBA makes it (or, made before, as the extension is made or the directory first written),
//! and a subscription to one made around that at the copy.

use std::time::Duration;

use shard_directory_e2e::{column, eventually, Cluster};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::directory::{directory_with, toggle};

const DEADLINE: Duration = Duration::from_secs(10);
const LOGICAL: &[(&str, &str)] = &[("wal_level", "logical")];

async fn database(cluster: &Cluster, db: &str) -> Client {
    cluster.create_database_with_extension(db).await;
    cluster.connect(db).await
}

/// The publications of `c`'s database that carry one of the directory's routing tables.
async fn carrying_the_directory(c: &Client) -> Vec<String> {
    column(
        c,
        "SELECT DISTINCT pubname::text FROM pg_catalog.pg_publication_tables
          WHERE schemaname = 'shard_directory'
            AND tablename IN ('shard_directory', 'shard_directory_version',
                              'shard_directory_history')
          ORDER BY 1",
        &[],
    )
    .await
}

/// A publication that would carry the directory's tables to a logical copy (a read copy in
/// another region, as one publishes a table) is refused where the DBA makes it: by name, by
/// schema, as all tables of a database that holds a directory, and added by ALTER PUBLICATION;
/// 0A000 naming the publication and the table, with what to use instead, and nothing is made.
/// A publication of the application's tables is made, and so is one of all tables of a shard,
/// whose directory tables are unused.
#[tokio::test]
async fn a_publication_of_the_directory_is_refused_where_it_is_made() {
    let (publisher, p) = directory_with(&[("wal_level", "logical")]).await;
    p.batch_execute("CREATE TABLE notes (id int PRIMARY KEY)")
        .await
        .unwrap();
    for (sql, table) in [
        (
            "CREATE PUBLICATION p FOR TABLE notes, shard_directory.shard_directory_history",
            "shard_directory_history",
        ),
        (
            "CREATE PUBLICATION p FOR TABLES IN SCHEMA shard_directory",
            "shard_directory",
        ),
        ("CREATE PUBLICATION p FOR ALL TABLES", "shard_directory"),
        (
            "CREATE PUBLICATION p FOR TABLE notes; \
             ALTER PUBLICATION p ADD TABLE shard_directory.shard_directory_version",
            "shard_directory_version",
        ),
        (
            "CREATE PUBLICATION p FOR TABLE notes; \
             ALTER PUBLICATION p SET TABLE shard_directory.shard_directory",
            "shard_directory",
        ),
        (
            "CREATE PUBLICATION p FOR TABLE notes; \
             ALTER PUBLICATION p ADD TABLES IN SCHEMA shard_directory",
            "shard_directory",
        ),
    ] {
        let e = p.batch_execute(sql).await.expect_err(sql);
        let db = e.as_db_error().expect("a server error");
        assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED, "{sql}: {db}");
        assert!(
            db.message().starts_with(&format!(
                "publication p cannot carry shard_directory.{table}:"
            )),
            "{sql}: {db}"
        );
        assert!(
            db.hint().is_some_and(|h| h.contains("physical standbys")),
            "{sql}: {db}"
        );
        assert_eq!(publications(&p).await, 0, "{sql}: nothing made");
    }
    // Made around the refusal, one publication carries the directory: the others are made
    // still, each command's own publications checked.
    p.batch_execute(
        "ALTER EVENT TRIGGER shard_directory_refuse_publication DISABLE; \
         CREATE PUBLICATION around FOR TABLE shard_directory.shard_directory; \
         ALTER EVENT TRIGGER shard_directory_refuse_publication ENABLE ALWAYS; \
         CREATE PUBLICATION notes FOR TABLE notes",
    )
    .await
    .unwrap();
    publisher.create_database_with_extension("a_shard").await;
    let shard = publisher.connect("a_shard").await;
    shard
        .batch_execute("CREATE PUBLICATION everything FOR ALL TABLES")
        .await
        .unwrap();
    assert_eq!(publications(&shard).await, 1);
    assert_eq!(publications(&p).await, 2);
}

/// The publications of `c`'s database.
async fn publications(c: &Client) -> i64 {
    c.query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0)
}

/// A subscription copying the directory through a publication made around that refusal (its
/// event trigger disabled by a superuser) is refused too, at the copy, and
/// says so: its initial copy failed for ever on the copy's own version row, and its apply wrote
/// entries that no rule checked, with no version, history or notification of the copy's own.
/// The initial copy and the apply of a change each stop on the directory's guard (0A000, naming
/// logical replication and what to use instead), and the copy's tables are left as they were.
#[tokio::test]
async fn a_logical_replication_copy_of_the_directory_is_refused() {
    let (publisher, p) = directory_with(&[("wal_level", "logical")]).await;
    p.batch_execute(
        "ALTER EVENT TRIGGER shard_directory_refuse_publication DISABLE; \
         CREATE PUBLICATION directory FOR TABLE shard_directory.shard_directory, \
         shard_directory.shard_directory_version, shard_directory.shard_directory_history; \
         ALTER EVENT TRIGGER shard_directory_refuse_publication ENABLE ALWAYS",
    )
    .await
    .unwrap();
    let subscriber = Cluster::start(
        "dir-subscriber",
        &[("wal_retrieve_retry_interval", "200ms")],
    );
    let mut copies = Vec::new();
    for (db, copy_data) in [("copy", true), ("apply", false)] {
        subscriber.create_database_with_extension(db).await;
        let s = subscriber.connect(db).await;
        s.batch_execute(&format!(
            "CREATE SUBSCRIPTION {db} CONNECTION '{}' PUBLICATION directory \
             WITH (copy_data = {copy_data})",
            publisher.conn_str("directory")
        ))
        .await
        .unwrap();
        copies.push((db, s));
    }
    // A change for the apply to carry.
    p.batch_execute(&toggle("8842")).await.unwrap();

    // The initial copy of the version table stops on its guard (the copies of the other tables
    // too), the apply of the change on the entries' guard.
    let refused =
        |table: &str| format!("shard_directory.{table} cannot be written by logical replication");
    eventually("both workers refused", DEADLINE, || async {
        let log = subscriber.server_log();
        let both = ["shard_directory_version", "shard_directory"]
            .iter()
            .all(|t| log.contains(&refused(t)));
        (both && log.contains("physical standbys")).then_some(())
    })
    .await;
    for (db, s) in &copies {
        let counter = if *db == "copy" {
            "sync_error_count"
        } else {
            "apply_error_count"
        };
        // Counted by the worker as it exits, just after it logs the error.
        eventually(&format!("{db}: {counter}"), DEADLINE, || async {
            let errors: i64 = s
                .query_one(
                    &format!("SELECT {counter} FROM pg_stat_subscription_stats WHERE subname = $1"),
                    &[db],
                )
                .await
                .unwrap()
                .get(0);
            (errors > 0).then_some(())
        })
        .await;
        let copied: (i64, i64, i64) = {
            let r = s
                .query_one(
                    "SELECT (SELECT count(*) FROM shard_directory.shard_directory), \
                            (SELECT count(*) FROM shard_directory.shard_directory_history), \
                            shard_directory.current_version()",
                    &[],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1), r.get(2))
        };
        assert_eq!(copied, (0, 0, 0), "{db}: the copy's tables as they were");
        s.batch_execute(&format!(
            "ALTER SUBSCRIPTION {db} DISABLE; ALTER SUBSCRIPTION {db} SET (slot_name = NONE); \
             DROP SUBSCRIPTION {db}"
        ))
        .await
        .unwrap();
    }
}

/// The refusal is of publications carrying the directory, not of publications: a role with
/// CREATE on the database (PostgreSQL 15+ lets it publish the tables it owns) publishes its own
/// table on a shard (CDC) as on a directory. The event trigger checks with the owner's rights:
/// run as the role, it failed every such publication with 42501 on the extension's schema.
#[tokio::test]
async fn a_table_owner_publishes_its_own_tables_where_the_extension_is() {
    let cluster = Cluster::start("a42-owner", LOGICAL);
    for db in ["a_shard", "a_directory"] {
        let c = database(&cluster, db).await;
        if db == "a_directory" {
            c.batch_execute(
                "INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1');
                 INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
                 VALUES ('tenant', '1', 'shard_1')",
            )
            .await
            .unwrap();
        }
        c.batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE cdc_owner LOGIN; EXCEPTION WHEN duplicate_object THEN END $$;
             GRANT CREATE ON DATABASE {db} TO cdc_owner;
             CREATE TABLE public.events (id int PRIMARY KEY);
             ALTER TABLE public.events OWNER TO cdc_owner;"
        ))
        .await
        .unwrap();
        let made = c
            .batch_execute(
                "SET ROLE cdc_owner; CREATE PUBLICATION cdc FOR TABLE public.events; RESET ROLE",
            )
            .await;
        let _ = c.batch_execute("RESET ROLE").await;
        assert!(
            made.is_ok(),
            "{db}: the owner of public.events could not publish it: {:?}",
            made.as_ref().err().and_then(|e| e.as_db_error().cloned())
        );
    }
}

/// A publication made before the extension (here in the very transaction that creates it: the
/// schema first, `FOR TABLES IN SCHEMA shard_directory`, then CREATE EXTENSION) is refused as
/// the extension is made: no event trigger saw it, and it carried every table of the directory.
#[tokio::test]
async fn a_publication_of_the_directory_s_schema_made_before_the_extension_is_refused() {
    let cluster = Cluster::start("a42-early", LOGICAL);
    let admin = cluster.connect("postgres").await;
    admin.batch_execute("CREATE DATABASE early").await.unwrap();
    let c = cluster.connect("early").await;
    let made = c
        .batch_execute(
            "BEGIN;
             CREATE SCHEMA shard_directory;
             CREATE PUBLICATION early FOR TABLES IN SCHEMA shard_directory;
             CREATE EXTENSION shard_directory;
             COMMIT;
             INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1');
             INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
             VALUES ('tenant', '1', 'shard_1');",
        )
        .await;
    // Refused inside the transaction block: it ends.
    c.batch_execute("ROLLBACK").await.unwrap();
    let carried = carrying_the_directory(&c).await;
    match made {
        Err(e) => {
            let db = e.as_db_error().expect("a server error");
            assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED, "{db}");
            assert!(db.message().contains("publication early"), "{db}");
            assert!(carried.is_empty(), "refused, yet made: {carried:?}");
        }
        Ok(()) => panic!(
            "made silently: publications {carried:?} carry the directory's tables, \
             and the directory was written"
        ),
    }
}

/// `FOR ALL TABLES` made in a new directory database before it is filled (version 0, as on a
/// shard) is refused at the directory's first version: from then on the database holds a
/// directory, which the publication would carry.
#[tokio::test]
async fn all_tables_published_before_the_directory_s_first_write_is_refused() {
    let cluster = Cluster::start("a42-alltables", LOGICAL);
    let c = database(&cluster, "directory").await;
    let made = c
        .batch_execute(
            "CREATE PUBLICATION everything FOR ALL TABLES;
             INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1');
             INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
             VALUES ('tenant', '1', 'shard_1');",
        )
        .await;
    let version: i64 = c
        .query_one("SELECT shard_directory.current_version()", &[])
        .await
        .unwrap()
        .get(0);
    let carried = carrying_the_directory(&c).await;
    match made {
        Err(e) => {
            let db = e.as_db_error().expect("a server error");
            assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED, "{db}");
        }
        Ok(()) => panic!(
            "made silently: at version {version} the database holds a directory, and \
             publications {carried:?} carry its tables"
        ),
    }
}
