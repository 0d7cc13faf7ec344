//! `status`'s naming of the value that stops a reversible move's way back
//! (`way_back_stopped_by`, mover/src/status/way_back.rs), off the path of mixed_fleet's test:
//! what it names is what stops the way back, and a way back that a value does not stop gets
//! nothing named. Found by the attack on issue 47's item 3; each failed before its fix.

use std::time::Duration;

use shard_directory_client::{EntityKey, Router};
use shard_directory_e2e::mover_cli;
use shard_directory_e2e::{eventually, within, Topology};
use shard_directory_mover::{MoveOptions, Phase, Unreadable};

const DEADLINE: Duration = Duration::from_secs(30);

const PLANS: &str = "
    CREATE TABLE plans (
        tenant_id text     NOT NULL,
        plan_id   int      NOT NULL,
        period    interval NOT NULL,
        PRIMARY KEY (tenant_id, plan_id));
    SELECT shard_directory.protect('plans', 'tenant_id', 'tenant');";

async fn write(router: &Router, tenant: &str, sql: &'static str, id: i32, period: &str) {
    let written: Result<(), shard_directory_client::Error> = router
        .run(&EntityKey::new("tenant", tenant), async |tx| {
            tx.execute(sql, &[&tenant, &id, &period]).await?;
            Ok(())
        })
        .await;
    written.unwrap_or_else(|e| panic!("{sql} ({id}, {period}) of {tenant}: {e}"));
}

async fn plan(router: &Router, tenant: &str, id: i32, period: &str) {
    write(
        router,
        tenant,
        "INSERT INTO plans (tenant_id, plan_id, period) VALUES ($1, $2, $3::text::interval)",
        id,
        period,
    )
    .await
}

async fn plan_ids(t: &Topology, shard: &str) -> Vec<i32> {
    let rows = t
        .shard(shard)
        .await
        .query(
            "SELECT plan_id FROM plans WHERE tenant_id = 'a' ORDER BY plan_id",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// 16 -> 17, reversible, tenant `a` with plans 1 and 2, plan 2 streamed back to 16.
async fn reversible(name: &str) -> (Topology, Router, i64) {
    reversible_with(name, PLANS).await
}

async fn reversible_with(name: &str, schema: &str) -> (Topology, Router, i64) {
    let t = Topology::mixed(name, 17, &[16, 17]).await;
    for (shard, _) in &t.shards {
        t.shard(shard).await.batch_execute(schema).await.unwrap();
    }
    t.add_tenant("a", "shard_1").await;
    let router = t.connected_router().await;
    plan(&router, "a", 1, "1 mon").await;
    let options = MoveOptions {
        reversible: true,
        max_freeze: Duration::from_secs(7),
        ..Default::default()
    };
    let there = t
        .mover(options)
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(there.phase, Phase::Reversible);
    plan(&router, "a", 2, "3 days").await;
    eventually("plan 2 back on 16", DEADLINE, || async {
        (plan_ids(&t, "shard_1").await == [1, 2]).then_some(())
    })
    .await;
    (t, router, there.move_id)
}

/// Waits until the way back's subscription on the source turned itself off
/// (`disable_on_error`) and its slot on the target is not active.
async fn way_back_stopped(t: &Topology, id: i64) {
    let name = format!("sd_move_{id}_back");
    eventually("the way back to stop", DEADLINE, || async {
        let off: bool = t
            .shard("shard_1")
            .await
            .query_one(
                "SELECT NOT subenabled FROM pg_subscription WHERE subname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        let inactive: bool = t
            .shard("shard_2")
            .await
            .query_one(
                "SELECT NOT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        (off && inactive).then_some(())
    })
    .await;
}

/// What `status` names as stopping move `id`'s way back, asked until it names something or
/// `wait` has passed.
async fn named(t: &Topology, id: i64, wait: Duration) -> Option<Unreadable> {
    let mover = t.mover(MoveOptions::default());
    within(wait, || async {
        mover
            .status_detail(id)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .way_back_stopped_by
    })
    .await
}

/// Slots `status` may have left on the target.
async fn peek_slots(t: &Topology) -> Vec<String> {
    let rows = t
        .shard("shard_2")
        .await
        .query(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE '%\\_peek\\_%'",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Upgrading a tenant from 16 to 17 with a way back: once the application writes a value only
/// 17 can hold, the way back to 16 stops at it for good, and `status` names that value, with
/// 16's own error, and what is left to do: finalize, which keeps every row on 17.
#[tokio::test]
async fn status_names_the_value_that_stops_a_way_back_to_an_older_major() {
    let (t, router, id) = reversible("way-back-value").await;
    plan(&router, "a", 3, "infinity").await;
    plan(&router, "a", 4, "1 year").await;
    let stopped = named(&t, id, DEADLINE)
        .await
        .expect("status names the value");
    assert_eq!(
        (
            stopped.table.as_str(),
            stopped.column.as_str(),
            stopped.type_name.as_str(),
            stopped.value.as_str(),
            stopped.sqlstate.as_str()
        ),
        ("public.plans", "period", "interval", "infinity", "22007"),
        "{stopped}"
    );
    assert!(stopped.error.contains("infinity"), "{stopped}");
    assert_eq!(plan_ids(&t, "shard_1").await, [1, 2]);

    let status = |json: bool| {
        let mut c = mover_cli::command(&t);
        c.args(["status", &id.to_string()]);
        if json {
            c.arg("--json");
        }
        c
    };
    let text = mover_cli::succeeded(&status(false).output().await.unwrap());
    assert!(
        text.contains(
            "the way back stopped at a value shard_1 cannot read: public.plans.period = \
             'infinity' (interval)"
        ) && text.contains(&format!("`finalize {id}` keeps it on shard_2")),
        "{text}"
    );
    let json = mover_cli::succeeded(&status(true).output().await.unwrap());
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["way_back_stopped_by"]["value"], "infinity", "{json}");

    // What is left: finalize, and every plan stays on 17.
    let done = t
        .mover(MoveOptions::default())
        .finalize(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.phase, Phase::Done);
    assert_eq!(t.placement("a").await, "shard_2");
    assert_eq!(peek_slots(&t).await, Vec::<String>::new());
    assert_eq!(plan_ids(&t, "shard_2").await, [1, 2, 3, 4]);
}

/// The way back stops at a CHECK violation on the source (plan 100, every value of it readable
/// by 16). A later change carries `interval 'infinity'`. `status` must not say the way back
/// "stopped at a value shard_1 cannot read" naming that later value: it is not what stopped it
/// (the source's log names the CHECK), and dropping the CHECK would let the way back go on to
/// plan 100.
#[tokio::test]
async fn a_check_violation_that_stops_the_way_back_is_not_blamed_on_a_later_value() {
    let (t, router, id) = reversible("atk47-check").await;
    t.shard("shard_1")
        .await
        .batch_execute("ALTER TABLE plans ADD CONSTRAINT below_100 CHECK (plan_id < 100)")
        .await
        .unwrap();
    plan(&router, "a", 100, "1 day").await;
    way_back_stopped(&t, id).await;
    let log = t.shard_cluster("shard_1").server_log();
    assert!(
        log.contains("violates check constraint \"below_100\""),
        "the source's log names the CHECK as what stopped it"
    );
    plan(&router, "a", 5, "infinity").await;

    // The peek sees only flushed WAL: give status a few seconds to see plan 5.
    let named = named(&t, id, Duration::from_secs(10)).await;
    assert_eq!(peek_slots(&t).await, Vec::<String>::new());
    assert_eq!(plan_ids(&t, "shard_1").await, [1, 2]);
    assert!(
        named.is_none(),
        "the way back stopped at plan 100's CHECK violation on shard_1, yet status says it \
         stopped at: {}",
        named.unwrap()
    );
}

/// The operator pauses the way back (`ALTER SUBSCRIPTION ... DISABLE`). Pending on it: an UPDATE
/// of a row the source does not have (its new row carries `interval 'infinity'`), which the
/// source's apply skips ("did not find row to be updated") without ever reading its new values,
/// and plan 9. `status` names nothing (it named the UPDATE's 'infinity' and said only
/// `finalize` was left); re-enabled, the way back streams on, plan 9 included.
#[tokio::test]
async fn a_value_the_source_never_reads_is_not_named_as_the_stop() {
    let (t, router, id) = reversible("atk47-skip").await;
    plan(&router, "a", 7, "1 day").await;
    eventually("plan 7 back on 16", DEADLINE, || async {
        (plan_ids(&t, "shard_1").await == [1, 2, 7]).then_some(())
    })
    .await;
    let name = format!("sd_move_{id}_back");
    // The source loses plan 7 (a DBA's cleanup), and the way back is paused.
    t.shard("shard_1")
        .await
        .batch_execute(&format!(
            "SET session_replication_role = replica;
             DELETE FROM plans WHERE tenant_id = 'a' AND plan_id = 7;
             RESET session_replication_role;
             ALTER SUBSCRIPTION {name} DISABLE;"
        ))
        .await
        .unwrap();
    eventually("the way back's slot to be let go", DEADLINE, || async {
        let active: bool = t
            .shard("shard_2")
            .await
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        (!active).then_some(())
    })
    .await;
    write(
        &router,
        "a",
        "UPDATE plans SET plan_id = 8, period = $3::text::interval \
         WHERE tenant_id = $1 AND plan_id = $2",
        7,
        "infinity",
    )
    .await;
    plan(&router, "a", 9, "2 days").await;

    let named = named(&t, id, Duration::from_secs(10)).await;
    assert_eq!(peek_slots(&t).await, Vec::<String>::new());

    // Turned on again, the way back goes past the UPDATE and applies plan 9.
    t.shard("shard_1")
        .await
        .batch_execute(&format!("ALTER SUBSCRIPTION {name} ENABLE"))
        .await
        .unwrap();
    let streamed = within(DEADLINE, || async {
        plan_ids(&t, "shard_1").await.contains(&9).then_some(())
    })
    .await;
    assert!(streamed.is_some(), "the way back did not stream plan 9");
    assert!(
        named.is_none(),
        "status said the way back stopped for good at {}, but it was only paused: enabled \
         again it streamed on (shard_1 now has plans {:?})",
        named.unwrap(),
        plan_ids(&t, "shard_1").await
    );
}

/// A bulk insert (50000 readable plans, one transaction) and right after it a plan of
/// `interval 'infinity'`. The way back applies the bulk insert and stops at 'infinity' before
/// the target's slot hears it confirmed, so the slot's next changes still begin with the bulk
/// insert: `status` reads from where the source's subscription says it applied, not from the
/// slot (it read the slot's next 1000 changes, all of the applied bulk insert, and never named
/// the value).
#[tokio::test]
async fn a_bulk_insert_just_before_the_value_hides_it() {
    let (t, router, id) = reversible("atk47-bulk").await;
    let lsn = async || -> String {
        t.shard("shard_2")
            .await
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap()
            .get(0)
    };
    let before_bulk = lsn().await;
    let bulk: Result<(), shard_directory_client::Error> = router
        .run(&EntityKey::new("tenant", "a"), async |tx| {
            tx.execute(
                "INSERT INTO plans SELECT 'a', g, '1 day' FROM generate_series(1000, 50999) g",
                &[],
            )
            .await?;
            Ok(())
        })
        .await;
    bulk.unwrap_or_else(|e| panic!("{e}"));
    let after_bulk = lsn().await;
    plan(&router, "a", 7, "infinity").await;
    let after_value = lsn().await;
    way_back_stopped(&t, id).await;
    let applied = plan_ids(&t, "shard_1").await.len();

    let named = named(&t, id, DEADLINE).await;
    let confirmed: String = t
        .shard("shard_2")
        .await
        .query_one(
            "SELECT confirmed_flush_lsn::text || ' restart ' || restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&format!("sd_move_{id}_back")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(peek_slots(&t).await, Vec::<String>::new());
    let named = named.unwrap_or_else(|| {
        panic!(
            "status never named the 'infinity' that stopped the way back within {DEADLINE:?} \
             (shard_1 applied {applied} plans, the bulk insert included; the way back's slot \
             is confirmed only to {confirmed}; the bulk insert's WAL on shard_2 runs from \
             {before_bulk} to {after_bulk}, the value's ends before {after_value})"
        )
    });
    assert_eq!(named.value, "infinity", "{named}");
}

/// `plans` with a column of an enum kept in its own schema, before `period`.
const TIERED: &str = "
    CREATE SCHEMA billing;
    CREATE TYPE billing.tier AS ENUM ('free', 'gold');
    CREATE TABLE plans (
        tenant_id text        NOT NULL,
        plan_id   int         NOT NULL,
        tier      billing.tier NOT NULL DEFAULT 'free',
        period    interval    NOT NULL,
        PRIMARY KEY (tenant_id, plan_id));
    SELECT shard_directory.protect('plans', 'tenant_id', 'tenant');";

/// The way back stops at `interval 'infinity'` (as in mixed_fleet's test), and `status` runs as
/// the mover's role holding what docs/operations.md lists (and REPLICATION on both shards), not
/// a superuser: it has no USAGE on schema `billing`, which nothing of a move needs (its values
/// are read and written as text). A value it may not read as its type says nothing of the value
/// (it named `tier = 'free'`, "permission denied for schema billing"): `period = 'infinity'` is
/// named.
#[tokio::test]
async fn status_as_the_documented_role_names_the_value_that_stops_the_way_back() {
    let (t, router, id) = reversible_with("atk47-role", TIERED).await;
    plan(&router, "a", 3, "infinity").await;
    way_back_stopped(&t, id).await;
    t.create_mover_role().await;
    t.grant_mover_as_readme_lists("public.plans", "public.orders_order_id_seq")
        .await;
    for (shard, _) in &t.shards {
        t.shard(shard)
            .await
            .batch_execute("ALTER ROLE mover REPLICATION")
            .await
            .unwrap();
    }
    let mover = t.mover_as_role(MoveOptions::default(), None);
    let named = within(DEADLINE, || async {
        mover
            .status_detail(id)
            .await
            .map_err(|e| eprintln!("status as mover: {e}"))
            .ok()?
            .way_back_stopped_by
    })
    .await
    .expect("status as the mover's role names a value");
    assert_eq!(peek_slots(&t).await, Vec::<String>::new());
    assert_eq!(
        (
            named.column.as_str(),
            named.value.as_str(),
            named.sqlstate.as_str()
        ),
        ("period", "infinity", "22007"),
        "status named: {named}"
    );
}
