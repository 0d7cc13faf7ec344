//! Invalidation by entity: a directory change retires the cached entries of
//! the keys it changed, not the whole cache; when the directory cannot say what changed, the
//! client flushes everything, as before.

use std::time::Duration;

use shard_directory_client::{Directory, DirectoryConfig, EntityKey, Error};
use shard_directory_e2e::{reaches, Topology};

const TENANTS: i64 = 200;

/// `TENANTS` tenants on shard_1, one statement.
async fn tenants(t: &Topology) -> i64 {
    t.add_tenants(TENANTS as usize, "shard_1").await
}

/// Looks every tenant up; returns how many lookups went to the directory.
async fn look_up_all(d: &Directory) -> u64 {
    let before = d.stats().cache_misses;
    for i in 1..=TENANTS {
        d.lookup("tenant", &i.to_string()).await.unwrap();
    }
    d.stats().cache_misses - before
}

#[tokio::test]
async fn new_tenants_and_a_move_retire_only_the_entries_they_changed() {
    let t = Topology::start("by-entity").await;
    let filled = tenants(&t).await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    reaches(&d, filled).await;
    assert_eq!(
        look_up_all(&d).await,
        TENANTS as u64,
        "the first pass fills"
    );
    assert!(matches!(
        d.lookup("tenant", "new-1").await,
        Err(Error::UnknownEntity(_))
    ));

    // Twenty new tenants, one statement each (new-1 among them, cached as unknown), and
    // tenant 5 starts a move.
    for i in 1..=20 {
        t.add_tenant(&format!("new-{i}"), "shard_2").await;
    }
    let moved = t
        .step("SELECT shard_directory.begin_move('tenant', '5', 'shard_2')")
        .await;
    reaches(&d, moved).await;

    assert_eq!(
        look_up_all(&d).await,
        1,
        "only tenant 5 changed: every other entry stays cached"
    );
    let five = d.lookup("tenant", "5").await.unwrap();
    assert_eq!(five.target_shard.as_deref(), Some("shard_2"));
    assert_eq!(
        d.lookup("tenant", "new-1").await.unwrap().shard_name,
        "shard_2",
        "the unknown entity cached before its insert is read again"
    );
    assert_eq!(d.stats().full_flushes, 0);

    // An entry read before the changes is stamped with the version the client knows now: the
    // shard sees a current request.
    let router = t.router(d.clone());
    let stamped: String = router
        .run(&EntityKey::new("tenant", "7"), async |tx| {
            let row = tx
                .query_one("SELECT current_setting('app.directory_version')", &[])
                .await?;
            Ok::<String, Error>(row.get(0))
        })
        .await
        .unwrap();
    assert_eq!(stamped, moved.to_string());
    assert_eq!(
        d.lookup("tenant", "7").await.unwrap().directory_version,
        filled
    );
}

/// With the watcher's poll hourly and LISTEN off, only `refresh()` reads what changed.
fn quiet() -> DirectoryConfig {
    DirectoryConfig::default()
        .listen(false)
        .poll_interval(Duration::from_secs(3600))
}

#[tokio::test]
async fn a_gap_history_no_longer_covers_flushes_the_whole_cache() {
    let t = Topology::start("purged").await;
    let filled = tenants(&t).await;
    let d = t.client_directory(quiet()).await;
    assert_eq!(d.version(), filled);
    look_up_all(&d).await;

    // Two changes the client does not hear of, then their history is purged.
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    let purged = t.purge_history().await;
    assert!(purged >= TENANTS + 2, "purged {purged} history rows");
    let last = t.add_tenant("c", "shard_1").await;

    assert_eq!(d.refresh().await.unwrap(), last);
    assert_eq!(d.stats().full_flushes, 1);
    assert_eq!(
        look_up_all(&d).await,
        TENANTS as u64,
        "everything is read again"
    );

    // From there on, history covers the gap again.
    let next = t.add_tenant("d", "shard_1").await;
    assert_eq!(d.refresh().await.unwrap(), next);
    assert_eq!(look_up_all(&d).await, 0);
    assert_eq!(d.stats().full_flushes, 1);
}

/// A router role given only the 0.1.0 grants (SELECT on the tables, no EXECUTE on
/// changes_since) still converges: every change flushes, as before.
#[tokio::test]
async fn a_role_without_changes_since_flushes_on_every_change() {
    let t = Topology::start("no-grant").await;
    let filled = tenants(&t).await;
    t.dba()
        .await
        .batch_execute(
            "CREATE ROLE old_router LOGIN; \
             GRANT USAGE ON SCHEMA shard_directory TO old_router; \
             GRANT SELECT ON shard_directory.shard_directory, \
                 shard_directory.shard_directory_version, shard_directory.shards TO old_router",
        )
        .await
        .unwrap();
    let mut config = t.directory_config();
    config.user("old_router");
    let d = Directory::connect(config, DirectoryConfig::default())
        .await
        .unwrap();
    reaches(&d, filled).await;
    look_up_all(&d).await;
    let added = t.add_tenant("a", "shard_1").await;
    reaches(&d, added).await;
    assert!(d.stats().full_flushes >= 1);
    assert_eq!(look_up_all(&d).await, TENANTS as u64);
}
