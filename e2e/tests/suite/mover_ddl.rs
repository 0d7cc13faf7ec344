//! DDL on a tenant's tables while it moves: a column added on one shard only, or a column's type
//! changed, is found before the cutover (by a subscription it stopped, before the freeze, or
//! under the freeze just before `complete_move`), and the move stops resumable naming the shard,
//! the table and the change, the tenant writable on its source; once the DBA makes the shards
//! agree, `resume` finishes it with every row once on the target.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use shard_directory_client::EntityKey;
use shard_directory_e2e::observe::act_at;
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{Error, Failure, Left, MethodChoice, MoveOptions, Phase, SchemaChange};
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);

fn tenant(id: &str) -> EntityKey {
    EntityKey::new("tenant", id)
}

fn method(method: MethodChoice) -> MoveOptions {
    MoveOptions {
        method,
        ..Default::default()
    }
}

/// An observer action that runs `sql` on `shard` the first time it is called.
fn ddl_once(
    t: &Topology,
    shard: &str,
    sql: &'static str,
) -> impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static {
    let (config, done) = (
        t.shard_cluster(shard).config("app"),
        Arc::new(AtomicBool::new(false)),
    );
    move || {
        let (config, done) = (config.clone(), done.clone());
        Box::pin(async move {
            if done.swap(true, Ordering::SeqCst) {
                return;
            }
            let (c, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            c.batch_execute(sql).await.expect("the DDL");
        })
    }
}

/// The changes a move stopped on, having checked it was left resumable.
fn changes_named(failure: &Failure) -> &[SchemaChange] {
    assert_eq!(failure.left, Left::Resumable, "{failure}");
    match &failure.error {
        Error::SchemaChanged { changes, .. } => changes,
        other => panic!("stopped on DDL, not on: {other}"),
    }
}

/// Where the stopped move leaves the tenant: migrating on shard_1 (routers write there), not
/// fenced there, and a write through a router commits.
async fn writable_on_source(t: &Topology, id: &str, move_id: i64, phase: Phase) {
    assert_eq!(
        t.entry("tenant", id).await,
        ("shard_1".into(), "migrating".into())
    );
    assert_eq!(t.fence("shard_1", id).await, None, "not frozen on shard_1");
    let record = t
        .mover(MoveOptions::default())
        .status(move_id)
        .await
        .unwrap();
    assert_eq!(record.phase, phase);
    let router = t.connected_router().await;
    Topology::order(&router, id, "while stopped")
        .await
        .expect("writable while the move is stopped");
}

/// `resume` finishes move `id` of tenant `a` (100 seeded orders of 2 lines, and the one written
/// while stopped): every row once on shard_2, none left on shard_1.
async fn resumed_to_the_target(t: &Topology, id: i64) {
    let done = t
        .mover(MoveOptions::default())
        .resume(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (101, 200));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
}

#[tokio::test]
async fn a_column_added_on_the_source_only_stops_a_logical_move_until_the_target_has_it() {
    let t = Topology::start("ddl-source").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 200, 2).await;
    let (stop, stopped) = watch::channel(false);
    let writer = t.keep_ordering("a", stopped);
    // The column added, the move goes on once the application's next order has stopped the
    // subscription (the target lacks the column: `disable_on_error`).
    let add = ddl_once(&t, "shard_1", "ALTER TABLE orders ADD COLUMN note text");
    let target = t.shard_cluster("shard_2").config("app");
    let act = act_at(Phase::CatchingUp, move || {
        let (added, target) = (add(), target.clone());
        Box::pin(async move {
            added.await;
            let (c, connection) = target.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            eventually("the subscription to stop", DEADLINE, || async {
                let on: bool = c
                    .query_one("SELECT bool_or(subenabled) FROM pg_subscription", &[])
                    .await
                    .unwrap()
                    .get(0);
                (!on).then_some(())
            })
            .await;
        })
    });
    let moves = async {
        let failure = t
            .mover(method(MethodChoice::Logical))
            .with_observer(act)
            .start(&tenant("a"), "shard_2")
            .await
            .expect_err("stopped by the DDL");
        // Found by the stopped subscription, and named for what stopped it.
        assert!(failure.to_string().starts_with("catch-up: "), "{failure}");
        let named = changes_named(&failure);
        assert_eq!(
            named,
            [SchemaChange {
                table: "public.orders".into(),
                shard: "shard_1".into(),
                what: "column note text added on shard_1 only".into(),
                fix: "ALTER TABLE public.orders ADD COLUMN note text on shard shard_2, or undo \
                      it on shard shard_1"
                    .into(),
            }],
            "{failure}"
        );
        let id = failure.move_id.expect("the move's id");
        writable_on_source(&t, "a", id, Phase::CatchingUp).await;
        // Resumed before the shards agree, it stops again, naming what the target lacks.
        let again = t.mover(MoveOptions::default()).resume(id).await;
        let again = again.expect_err("the target still lacks the column");
        assert!(
            changes_named(&again)
                .iter()
                .any(|c| c.what == "column note text is on shard shard_1 but not on shard_2"),
            "{again}"
        );
        t.shard("shard_2")
            .await
            .batch_execute("ALTER TABLE orders ADD COLUMN note text")
            .await
            .unwrap();
        let done = t.mover(MoveOptions::default()).resume(id).await;
        stop.send(true).unwrap();
        done.unwrap_or_else(|e| panic!("{e}"))
    };
    let (done, acked) = tokio::join!(moves, writer);
    assert_eq!(done.phase, Phase::Done);
    assert!(acked > 0, "the application kept writing");
    // Every order acked (and the one written while stopped) once on shard_2, none on shard_1.
    assert_eq!(t.rows("shard_2", "a").await, (200 + acked + 1, 400));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_2".into(), "active".into())
    );
}

#[tokio::test]
async fn a_column_added_on_the_target_only_under_a_copy_moves_freeze_undoes_it() {
    let t = Topology::start("ddl-target").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 100, 2).await;
    let add = ddl_once(&t, "shard_2", "ALTER TABLE orders ADD COLUMN note text");
    let failure = t
        .mover(method(MethodChoice::Copy))
        .with_observer(act_at(Phase::Frozen, add))
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("stopped by the DDL");
    let named = changes_named(&failure);
    assert_eq!(named.len(), 1, "{failure}");
    assert_eq!(
        (named[0].table.as_str(), named[0].shard.as_str()),
        ("public.orders", "shard_2")
    );
    assert_eq!(named[0].what, "column note text added on shard_2 only");
    assert!(
        named[0]
            .fix
            .contains("ALTER TABLE public.orders ADD COLUMN note text on shard shard_1"),
        "{failure}"
    );
    // Found under the freeze, just before the cutover: the freeze undone, the tenant writable on
    // its source, the target still fenced for the move.
    assert!(failure.to_string().starts_with("cutover: "), "{failure}");
    let id = failure.move_id.expect("the move's id");
    writable_on_source(&t, "a", id, Phase::Migrating).await;
    assert_eq!(t.fence("shard_2", "a").await.as_deref(), Some("frozen"));
    // A target may have a column the source lacks (preflight lets a move start so): resumed as
    // it is, the move copies again and finishes.
    resumed_to_the_target(&t, id).await;
}

#[tokio::test]
async fn a_column_retyped_on_the_source_under_a_logical_freeze_is_named() {
    let t = Topology::start("ddl-type").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 100, 2).await;
    let retype = "ALTER TABLE order_lines ALTER COLUMN product TYPE varchar(40)";
    let failure = t
        .mover(method(MethodChoice::Logical))
        .with_observer(act_at(Phase::Frozen, ddl_once(&t, "shard_1", retype)))
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("stopped by the DDL");
    let named = changes_named(&failure);
    assert_eq!(
        named,
        [SchemaChange {
            table: "public.order_lines".into(),
            shard: "shard_1".into(),
            what: "column product changed from text to character varying(40) on shard_1 only"
                .into(),
            fix: "ALTER TABLE public.order_lines ALTER COLUMN product TYPE character \
                  varying(40) on shard shard_2, or undo it on shard shard_1"
                .into(),
        }],
        "{failure}"
    );
    let id = failure.move_id.expect("the move's id");
    writable_on_source(&t, "a", id, Phase::CatchingUp).await;
    t.shard("shard_2")
        .await
        .batch_execute(retype)
        .await
        .unwrap();
    resumed_to_the_target(&t, id).await;
}

#[tokio::test]
async fn a_column_dropped_on_the_source_under_a_copy_moves_freeze_stops_it_instead_of_aborting() {
    let t = Topology::start("ddl-drop").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 100, 2).await;
    // The copy then reads a column that is gone: the error it meets is told as the DDL it is.
    let drop = "ALTER TABLE order_lines DROP COLUMN product";
    let failure = t
        .mover(method(MethodChoice::Copy))
        .with_observer(act_at(Phase::Frozen, ddl_once(&t, "shard_1", drop)))
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("stopped by the DDL");
    let named = changes_named(&failure);
    assert_eq!(
        named
            .iter()
            .map(|c| (c.what.as_str(), c.fix.as_str()))
            .collect::<Vec<_>>(),
        [(
            "column product text dropped on shard_1 only",
            "ALTER TABLE public.order_lines DROP COLUMN product on shard shard_2, or undo it on \
             shard shard_1"
        )],
        "{failure}"
    );
    let id = failure.move_id.expect("the move's id");
    writable_on_source(&t, "a", id, Phase::Migrating).await;
    t.shard("shard_2").await.batch_execute(drop).await.unwrap();
    resumed_to_the_target(&t, id).await;
}
