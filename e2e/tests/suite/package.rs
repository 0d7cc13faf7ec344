//! The Debian packages (`scripts/package.sh`), smoke-tested on the major `PG_CONFIG` names:
//! `scripts/test-packages.sh` installs that major's package (removing what was installed before,
//! and checking the files are the package's), then runs these. The extension offers every
//! release that has an install script and updates from each to the current version; on a
//! directory, a change is notified to a listener at commit; on a shard that preloads the library,
//! a write checked with a stale version is refused with 40001 and a current one is taken. (Any
//! install of the extension passes them: the rest of the suite runs them on its own.)

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use shard_directory_e2e::topology::SHARD_SETTINGS;
use shard_directory_e2e::{column, eventually, Cluster, Install, Listener};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Error};

const DEADLINE: Duration = Duration::from_secs(10);

/// The extension's version: the `shard_directory` crate's (the workspace's root package).
fn current_version() -> String {
    let manifest = include_str!("../../../Cargo.toml");
    let package = &manifest[manifest
        .find("\n[package]")
        .expect("[package] in Cargo.toml")..];
    package
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the root package's version")
        .to_owned()
}

/// The earlier releases whose install scripts are kept (`sql/shard_directory--A.sql`), oldest
/// first.
fn earlier_releases() -> Vec<String> {
    let sql = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sql");
    let mut versions: Vec<Vec<u32>> = std::fs::read_dir(&sql)
        .expect("read sql/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let version = name
                .strip_prefix("shard_directory--")?
                .strip_suffix(".sql")?;
            (!version.contains("--"))
                .then(|| version.split('.').map(|n| n.parse().unwrap()).collect())
        })
        .collect();
    versions.sort();
    versions
        .iter()
        .map(|v| v.iter().map(u32::to_string).collect::<Vec<_>>().join("."))
        .collect()
}

async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(c: &Client, sql: &str) -> T {
    c.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{sql}: {}",
                e.as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_owned())
            )
        })
        .get(0)
}

/// The next notification `listener` receives, within the deadline.
async fn notified(listener: &mut Listener, what: &str) -> (String, String) {
    let rx = &mut listener.notifications;
    let n = eventually(what, DEADLINE, || std::future::ready(rx.try_recv().ok())).await;
    (n.channel().to_owned(), n.payload().to_owned())
}

#[tokio::test]
async fn the_package_offers_each_release_and_updates_from_each_to_the_current_version() {
    let cluster = Cluster::start("package-versions", &[]);
    let admin = cluster.connect("postgres").await;
    assert_eq!(
        one::<i32>(
            &admin,
            "SELECT current_setting('server_version_num')::int / 10000"
        )
        .await,
        Install::configured().server_major(),
        "the cluster runs the major PG_CONFIG names"
    );
    let current = current_version();
    let earlier = earlier_releases();
    assert!(earlier.contains(&"0.1.0".to_owned()), "{earlier:?}");
    let offered: Vec<String> = column(
        &admin,
        "SELECT version FROM pg_available_extension_versions WHERE name = 'shard_directory' \
         ORDER BY string_to_array(version, '.')::int[]",
        &[],
    )
    .await;
    let mut expected = earlier.clone();
    expected.push(current.clone());
    assert_eq!(offered, expected);
    assert_eq!(
        one::<String>(
            &admin,
            "SELECT default_version FROM pg_available_extensions WHERE name = 'shard_directory'"
        )
        .await,
        current
    );

    for release in &earlier {
        let db = format!("from_{}", release.replace('.', "_"));
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
        let c = cluster.connect(&db).await;
        c.batch_execute(&format!(
            "CREATE EXTENSION shard_directory VERSION '{release}'"
        ))
        .await
        .unwrap_or_else(|e| panic!("CREATE EXTENSION ... VERSION '{release}': {e}"));
        let installed = "SELECT extversion FROM pg_extension WHERE extname = 'shard_directory'";
        assert_eq!(one::<String>(&c, installed).await, *release);
        c.batch_execute("ALTER EXTENSION shard_directory UPDATE")
            .await
            .unwrap_or_else(|e| {
                panic!("ALTER EXTENSION shard_directory UPDATE from {release}: {e}")
            });
        assert_eq!(one::<String>(&c, installed).await, current);
        // A function of the library, called through the updated catalog.
        assert_eq!(
            one::<i64>(&c, "SELECT shard_directory.current_version()").await,
            0
        );
    }
}

#[tokio::test]
async fn a_directory_change_is_notified_to_a_listener_at_commit() {
    let cluster = Cluster::start("package-directory", &[]);
    cluster.create_database_with_extension("directory").await;
    let dba = cluster.connect("directory").await;
    let mut listener = cluster.connect_listening("directory").await;
    listener
        .client
        .batch_execute("LISTEN shard_directory")
        .await
        .unwrap();

    dba.batch_execute(
        "INSERT INTO shard_directory.shards (shard_name, region) VALUES ('shard_1', 'eu'), ('shard_2', 'eu');
         INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name)
         VALUES ('tenant', '8842', 'shard_1')",
    )
    .await
    .expect("register two shards and place a tenant");
    let placed = one::<i64>(&dba, "SELECT shard_directory.current_version()").await;
    assert!(placed > 0);
    assert_eq!(
        notified(&mut listener, "the placement's notification").await,
        ("shard_directory".to_owned(), placed.to_string())
    );

    dba.batch_execute("BEGIN").await.unwrap();
    let begun = one::<i64>(
        &dba,
        "SELECT shard_directory.begin_move('tenant', '8842', 'shard_2')",
    )
    .await;
    assert_eq!(begun, placed + 1);
    assert!(
        listener.notifications.try_recv().is_err(),
        "nothing is notified before COMMIT"
    );
    dba.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        notified(&mut listener, "begin_move's notification").await,
        ("shard_directory".to_owned(), begun.to_string())
    );

    let frozen = one::<i64>(&dba, "SELECT shard_directory.freeze('tenant', '8842')").await;
    assert_eq!(
        notified(&mut listener, "freeze's notification").await,
        ("shard_directory".to_owned(), frozen.to_string())
    );
    let completed = one::<i64>(
        &dba,
        "SELECT shard_directory.complete_move('tenant', '8842')",
    )
    .await;
    assert_eq!(
        notified(&mut listener, "complete_move's notification").await,
        ("shard_directory".to_owned(), completed.to_string())
    );
    let entry = dba
        .query_one(
            "SELECT shard_name, state, version FROM shard_directory.shard_directory \
             WHERE entity_type = 'tenant' AND entity_id = '8842'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            entry.get::<_, String>(0),
            entry.get::<_, String>(1),
            entry.get::<_, i64>(2)
        ),
        ("shard_2".to_owned(), "active".to_owned(), completed)
    );
    // The guide's bare re-point of an active entry is refused by the library's trigger.
    let err = dba
        .batch_execute(
            "UPDATE shard_directory.shard_directory SET shard_name = 'shard_1' \
             WHERE entity_type = 'tenant' AND entity_id = '8842'",
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().expect("a database error").code(),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
    );
}

/// One insert into `orders` in its own transaction, stamped as the client crate stamps it.
async fn checked_write(c: &Client, version: i64, tenant: &str) -> Result<(), Error> {
    c.batch_execute("BEGIN").await?;
    let result = async {
        c.execute(
            "SELECT set_config('app.directory_version', $1, true), \
             set_config('app.entity_type', 'tenant', true), set_config('app.entity_id', $2, true)",
            &[&version.to_string(), &tenant],
        )
        .await?;
        c.execute(
            "INSERT INTO orders VALUES ($1, $2)",
            &[&tenant, &format!("v{version}")],
        )
        .await
    }
    .await;
    match result {
        Ok(_) => c.batch_execute("COMMIT").await,
        Err(e) => {
            c.batch_execute("ROLLBACK").await?;
            Err(e)
        }
    }
}

#[tokio::test]
async fn a_shard_refuses_a_stale_write_with_40001_and_takes_a_current_one() {
    let cluster = Cluster::start("package-shard", SHARD_SETTINGS);
    cluster.create_database_with_extension("app").await;
    let dba = cluster.connect("app").await;
    assert_eq!(
        one::<String>(&dba, "SHOW shared_preload_libraries").await,
        "shard_directory"
    );
    dba.batch_execute(
        "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
         SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');",
    )
    .await
    .unwrap();
    assert_eq!(
        one::<i64>(&dba, "SELECT shard_directory.raise_min_accepted(42)").await,
        42
    );

    let writer = cluster.connect("app").await;
    let err = checked_write(&writer, 41, "8842").await.unwrap_err();
    let db = err.as_db_error().expect("a database error");
    assert_eq!(
        db.code(),
        &SqlState::T_R_SERIALIZATION_FAILURE,
        "{}",
        db.message()
    );
    let detail: Value = serde_json::from_str(db.detail().expect("a DETAIL")).unwrap();
    assert_eq!(
        detail,
        serde_json::json!({"client_version": 41, "min_accepted": 42, "reason": "stale"})
    );
    checked_write(&writer, 42, "8842")
        .await
        .expect("a write checked with the current version commits");
    let items: Vec<String> = column(&dba, "SELECT item FROM orders", &[]).await;
    assert_eq!(items, ["v42"]);

    // Counted in the preloaded library's shared memory, across backends.
    let stats: Vec<(String, i64)> = dba
        .query(
            "SELECT reason, count FROM shard_directory.stats() \
             WHERE reason IN ('checks', 'stale') ORDER BY reason",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(stats, [("checks".to_owned(), 2), ("stale".to_owned(), 1)]);
}
