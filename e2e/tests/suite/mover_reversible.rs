//! `move --reversible`: after the cutover the tenant's rows stream back to its source, so
//! `revert` takes it back with only a freeze and no write lost, an aborted revert leaves it
//! reversible, `finalize` (or `--reversible-for` running out) ends it where it is, and both
//! moves killed inside their freezes resume to the end; writes made while the source was down
//! reach it once it is back. No shard a way back joins is drained until the move is finalized,
//! and a finalize whose source is gone still releases the target's WAL.

use std::time::Duration;

use shard_directory_client::{EntityKey, Router};
use shard_directory_e2e::mover_cli;
use shard_directory_e2e::observe::{self, until_held};
use shard_directory_e2e::{column, eventually, Topology};
use shard_directory_mover::{Error, MoveOptions, Phase};
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);

fn tenant(id: &str) -> EntityKey {
    EntityKey::new("tenant", id)
}

/// A reversible move, its `--max-freeze` other than the default (a revert keeps the move's).
fn reversible(reversible_for: Option<Duration>) -> MoveOptions {
    MoveOptions {
        reversible: true,
        reversible_for,
        max_freeze: Duration::from_secs(7),
        ..Default::default()
    }
}

/// Through the router, wherever the tenant lives: seeded order `changed` renamed, and seeded
/// order `gone` deleted with its lines (a child table's rows and its parent's).
async fn change_and_delete(router: &Router, id: &str, changed: i64, gone: i64) {
    let (changed, gone) = (format!("seed {id} {changed}"), format!("seed {id} {gone}"));
    let changed: Result<(), shard_directory_client::Error> = router
        .run(&tenant(id), async |tx| {
            tx.execute(
                "UPDATE orders SET item = item || ' changed' WHERE tenant_id = $1 AND item = $2",
                &[&id, &changed],
            )
            .await?;
            tx.execute(
                "DELETE FROM order_lines l USING orders o \
                 WHERE l.tenant_id = $1 AND o.tenant_id = $1 AND l.order_id = o.order_id \
                   AND o.item = $2",
                &[&id, &gone],
            )
            .await?;
            tx.execute(
                "DELETE FROM orders WHERE tenant_id = $1 AND item = $2",
                &[&id, &gone],
            )
            .await?;
            Ok(())
        })
        .await;
    changed.expect("change the tenant's rows");
}

/// Waits until `shard` shows seeded order `changed` renamed and `gone` deleted.
async fn shows_change(t: &Topology, shard: &str, id: &str, changed: i64, gone: i64) {
    let (changed, gone) = (
        format!("seed {id} {changed} changed"),
        format!("seed {id} {gone}"),
    );
    eventually("the change to reach the source", DEADLINE, || async {
        let items = t.orders(shard, id).await;
        (items.contains(&changed) && !items.contains(&gone)).then_some(())
    })
    .await;
}

async fn objects(t: &Topology) -> Vec<String> {
    let mut found = t.replication_objects().await;
    found.sort();
    found
}

fn way_back(id: i64) -> Vec<String> {
    vec![
        format!("shard_1: subscription sd_move_{id}_back"),
        format!("shard_2: publication sd_move_{id}_back"),
        format!("shard_2: slot sd_move_{id}_back"),
    ]
}

/// The state a reversible move of tenant `id` (move `move_id`) leaves: the entity active on
/// shard_2, fenced `moved` on shard_1 and `owned` on shard_2, and only the way back replicating.
async fn assert_reversible(t: &Topology, id: &str, move_id: i64) {
    assert_eq!(
        t.entry("tenant", id).await,
        ("shard_2".into(), "active".into())
    );
    assert_eq!(
        t.fence("shard_1", id).await.as_deref(),
        Some("moved:shard_2")
    );
    assert_eq!(t.fence("shard_2", id).await.as_deref(), Some("owned"));
    assert_eq!(objects(t).await, way_back(move_id), "only the way back");
}

#[tokio::test]
async fn a_reverted_move_brings_back_every_write_made_on_either_side_of_both_switches() {
    let t = Topology::with_shards("reversible", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    t.seed_orders("shard_1", "a", 300, 2).await;
    t.seed_orders("shard_1", "b", 10, 2).await;
    let (stop, stopped) = watch::channel(false);
    let writer = t.keep_ordering("a", stopped);
    let moves = async {
        let there = t
            .mover(reversible(None))
            .start(&tenant("a"), "shard_2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(there.phase, Phase::Reversible);
        assert!(there.finished_at.is_none() && there.reversible_until.is_none());
        assert_reversible(&t, "a", there.move_id).await;
        // Written on the target after the first switch, carried to the source.
        let router = t.connected_router().await;
        change_and_delete(&router, "a", 1, 2).await;
        shows_change(&t, "shard_1", "a", 1, 2).await;
        let back = t
            .mover(MoveOptions::default())
            .revert(there.move_id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Written on the source after the second switch.
        change_and_delete(&router, "a", 3, 4).await;
        stop.send(true).unwrap();
        (there, back)
    };
    let ((there, back), acked) = tokio::join!(moves, writer);
    assert!(acked > 0, "the application kept writing");
    assert_eq!(back.phase, Phase::Done);
    assert_eq!(back.reverses, Some(there.move_id));
    // Its freeze bounded as the move's was, not by the reverting mover's default.
    assert_eq!(back.max_freeze_ms, there.max_freeze_ms);
    assert_eq!(
        (back.source_shard.as_str(), back.target_shard.as_str()),
        ("shard_2", "shard_1")
    );
    assert!(back.freeze_time().is_some());
    let there = t
        .mover(MoveOptions::default())
        .status(there.move_id)
        .await
        .unwrap();
    assert_eq!(there.phase, Phase::Reverted);
    assert!(there.finished_at.is_some());
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    // Every order acked, on either shard, is on the source; two seeded orders deleted.
    assert_eq!(t.rows("shard_1", "a").await, (300 + acked - 2, 600 - 4));
    let items = t.orders("shard_1", "a").await;
    for changed in ["seed a 1 changed", "seed a 3 changed"] {
        assert!(items.contains(&changed.to_owned()), "{changed}");
    }
    assert_eq!(
        t.rows("shard_2", "a").await,
        (0, 0),
        "nothing left on the target"
    );
    assert_eq!(t.rows("shard_1", "b").await, (10, 20), "other tenants stay");
    assert_eq!(t.fence("shard_1", "a").await.as_deref(), Some("owned"));
    assert_eq!(
        t.fence("shard_2", "a").await.as_deref(),
        Some("moved:shard_1")
    );
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
    // Sequences followed: new orders on the source do not collide with the carried ones.
    let router = t.connected_router().await;
    Topology::order(&router, "a", "after")
        .await
        .expect("a new order");
}

#[tokio::test]
async fn an_aborted_revert_leaves_the_move_reversible_and_finalize_ends_it() {
    let t = Topology::with_shards("finalize", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 100, 2).await;
    // The way back publishes from the target: a replica identity there without the key column
    // is refused, naming the shard, the table and the fix, and nothing is recorded.
    let target = t.shard("shard_2").await;
    target
        .batch_execute("ALTER TABLE order_lines REPLICA IDENTITY NOTHING")
        .await
        .unwrap();
    let refused = t
        .mover(reversible(None))
        .start(&tenant("a"), "shard_2")
        .await
        .expect_err("no way back");
    match &refused.error {
        Error::Preflight { problem, fix } => {
            assert!(problem.contains("--reversible"), "{problem}");
            assert!(
                problem.contains("order_lines on source shard shard_2"),
                "{problem}"
            );
            assert!(fix.contains("REPLICA IDENTITY"), "{fix}");
        }
        other => panic!("{other}"),
    }
    let moves = t
        .mover(MoveOptions::default())
        .list(false, None)
        .await
        .unwrap();
    assert!(moves.is_empty(), "no move recorded");
    target
        .batch_execute("ALTER TABLE order_lines REPLICA IDENTITY DEFAULT")
        .await
        .unwrap();

    // Stopped dead under its freeze, then aborted: no way back is left behind.
    let key = tenant("a");
    let stopped = observe::crash_at(&t, reversible(None), &key, "shard_2", Phase::Frozen).await;
    let aborted = t.mover(MoveOptions::default()).abort(stopped).await;
    assert_eq!(
        aborted.unwrap_or_else(|e| panic!("{e}")).phase,
        Phase::Aborted
    );
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));

    let there = t
        .mover(reversible(Some(Duration::from_millis(1))))
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(there.phase, Phase::Reversible);
    assert!(there.reversible_until.is_some());

    // No other move of the tenant while it is reversible, and the refusal changes nothing.
    let refused = t
        .mover(MoveOptions::default())
        .start(&tenant("a"), "shard_1")
        .await
        .expect_err("refused while reversible");
    match &refused.error {
        Error::Preflight { problem, fix } => {
            assert!(problem.contains("reversible"), "{problem}");
            assert!(
                fix.contains(&format!("finalize {}", there.move_id)),
                "{fix}"
            );
        }
        other => panic!("{other}"),
    }
    let moves = t
        .mover(MoveOptions::default())
        .list(false, None)
        .await
        .unwrap();
    assert_eq!(moves.len(), 2, "no move recorded");
    // Cleanup leaves the way back of a reversible move alone.
    t.mover(MoveOptions::default()).cleanup().await.unwrap();
    assert_eq!(objects(&t).await, way_back(there.move_id));

    // A revert stopped dead under its freeze, then aborted: the way back is left as it was.
    let (hold, reached) = observe::hold_at(Phase::Frozen);
    let mover = t.mover(MoveOptions::default()).with_observer(hold);
    until_held(&reached, "the revert", mover.revert(there.move_id)).await;
    let revert = there.move_id + 1;
    let refused = t
        .mover(MoveOptions::default())
        .finalize(there.move_id)
        .await;
    let refused = refused.expect_err("not finalized while a revert of it is under way");
    assert!(
        refused
            .to_string()
            .contains(&format!("move {revert} is reverting it")),
        "{refused}"
    );
    let aborted = t
        .mover(MoveOptions::default())
        .abort(revert)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(aborted.phase, Phase::Aborted);
    let status = t
        .mover(MoveOptions::default())
        .status(there.move_id)
        .await
        .unwrap();
    assert_eq!(status.phase, Phase::Reversible);
    assert_reversible(&t, "a", there.move_id).await;
    assert_eq!(
        t.rows("shard_1", "a").await,
        (100, 200),
        "the source's rows stay"
    );
    let router = t.connected_router().await;
    change_and_delete(&router, "a", 5, 6).await;
    shows_change(&t, "shard_1", "a", 5, 6).await;

    // Its --reversible-for has run out: finalize --expired ends it where it is.
    let finalized = t
        .mover(MoveOptions::default())
        .finalize_expired()
        .await
        .unwrap();
    assert_eq!(finalized.len(), 1);
    let done = finalized
        .into_iter()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((done.move_id, done.phase), (there.move_id, Phase::Done));
    assert!(done.finalized_at.is_some());
    assert_eq!(t.rows("shard_1", "a").await, (0, 0), "the source cleared");
    assert_eq!(t.rows("shard_2", "a").await, (99, 198));
    assert_eq!(
        t.fence("shard_1", "a").await.as_deref(),
        Some("moved:shard_2")
    );
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
    let again = t
        .mover(MoveOptions::default())
        .finalize(there.move_id)
        .await;
    assert!(again.is_err(), "a finished move is not finalized twice");
}

/// `status <id>` as the CLI prints it.
async fn status_text(t: &Topology, id: i64) -> String {
    let out = mover_cli::command(t)
        .args(["status", &id.to_string()])
        .output()
        .await
        .expect("run shard-directory status");
    mover_cli::succeeded(&out)
}

#[tokio::test]
async fn a_reversible_move_and_its_revert_killed_inside_their_freezes_resume_to_the_end() {
    let t = Topology::with_shards("cli-reversible", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 2000, 2).await;
    let delay = Duration::from_millis(20);
    let args = ["move", "tenant", "a", "--to", "shard_2", "--reversible"];
    let killed = mover_cli::kill_inside(&t, "a", &args, Phase::Frozen, delay)
        .await
        .expect("killed before it finished");
    let there = killed.move_id;
    if killed.stopped_at.is_some() {
        mover_cli::finish(&t, "resume", there).await;
    }
    let status = status_text(&t, there).await;
    assert!(
        status.contains(&format!("move {there} reversible")),
        "{status}"
    );
    assert!(
        status.contains(&format!("slot sd_move_{there}_back on shard_2")),
        "{status}"
    );
    assert_eq!(
        t.rows("shard_1", "a").await,
        (2000, 4000),
        "kept on the source"
    );
    assert_eq!(t.rows("shard_2", "a").await, (2000, 4000));

    let there_text = there.to_string();
    let args = ["revert", &there_text];
    let killed = mover_cli::kill_inside(&t, "a", &args, Phase::Frozen, delay)
        .await
        .expect("killed before it finished");
    let back = killed.move_id;
    assert_ne!(back, there);
    if killed.stopped_at.is_some() {
        mover_cli::finish(&t, "resume", back).await;
    }
    let status = status_text(&t, back).await;
    assert!(status.contains(&format!("move {back} done")), "{status}");
    assert!(
        status.contains(&format!("reverts move {there}")),
        "{status}"
    );
    assert!(status_text(&t, there)
        .await
        .contains(&format!("move {there} reverted")));
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(t.rows("shard_1", "a").await, (2000, 4000));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);

    // Nothing to finalize: it says nothing and succeeds.
    let out = mover_cli::command(&t)
        .args(["finalize", "--expired"])
        .output()
        .await
        .unwrap();
    assert_eq!(mover_cli::succeeded(&out), "");
}

#[tokio::test]
async fn the_way_back_keeps_what_was_written_while_the_source_was_down() {
    let t = Topology::with_shards("reversible-down", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 50, 2).await;
    let there = t
        .mover(reversible(None))
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The source stops; the tenant lives on the target and is written there meanwhile.
    t.shard_cluster("shard_1").stop();
    let router = t.connected_router().await;
    change_and_delete(&router, "a", 1, 2).await;
    for i in 0..20 {
        Topology::order(&router, "a", &format!("while down {i}"))
            .await
            .expect("written on the target");
    }
    // `status` shows the way back's slot keeping the target's WAL, not streaming.
    let mover = t.mover(MoveOptions::default());
    let slot = eventually("the way back to stop streaming", DEADLINE, || async {
        let slot = mover.status_detail(there.move_id).await.ok()?.slot?;
        (!slot.active).then_some(slot)
    })
    .await;
    assert_eq!(
        (slot.shard.as_str(), slot.name),
        ("shard_2", format!("sd_move_{}_back", there.move_id))
    );
    assert!(slot.retained_wal_bytes > 0);
    // And says so above it, not that the rows stream back.
    let status = status_text(&t, there.move_id).await;
    assert!(
        status.contains("its way back to shard_1 is not streaming")
            && !status.contains("stream back to"),
        "{status}"
    );
    // Back up, the source catches up, and the revert brings every write home.
    t.shard_cluster("shard_1").restart();
    shows_change(&t, "shard_1", "a", 1, 2).await;
    let back = mover
        .revert(there.move_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.phase, Phase::Done);
    assert_eq!(t.rows("shard_1", "a").await, (50 - 1 + 20, 100 - 2));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
}

#[tokio::test]
async fn a_shard_a_way_back_joins_is_not_drained_until_the_move_is_finalized() {
    let t = Topology::with_shards("drain-way-back", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 2).await;
    t.seed_orders("shard_1", "b", 10, 2).await;
    // A plan to drain shard_1, made before any way back joins it.
    let file = std::env::temp_dir().join(format!("sd-drain-back-{}.json", std::process::id()));
    let path = file.to_str().unwrap();
    let cli = async |args: &[&str]| {
        let out = mover_cli::command(&t).args(args).output().await.unwrap();
        (out.status.code(), mover_cli::text(&out.stderr))
    };
    let (code, said) = cli(&["drain", "shard_1", "--out", path]).await;
    assert_eq!(code, Some(0), "{said}");

    let there = t
        .mover(reversible(None))
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = there.move_id;
    // Its way back ends on shard_1 and starts from shard_2: neither is drained, by a plan, at
    // once, or from the plan made before; each refusal names the move and what ends it.
    let refusals = [
        vec!["drain", "shard_1"],
        vec!["drain", "shard_1", "--apply"],
        vec!["drain", "shard_2", "--apply"],
        vec!["move", "--from-file", path],
    ];
    for args in refusals {
        let (code, said) = cli(&args).await;
        assert_eq!(code, Some(1), "{args:?}: {said}");
        for named in [
            format!("the way back of move {id} of tenant/a (shard_1 -> shard_2, reversible)"),
            format!("`shard-directory finalize {id}` (keeps tenant/a on shard_2)"),
            format!("`shard-directory revert {id}` (takes it back to shard_1)"),
        ] {
            assert!(said.contains(&named), "{args:?}: {said}");
        }
    }
    // Nothing recorded, nothing moved, the way back as it was.
    assert_eq!(t.batches().await, 0, "no batch recorded");
    assert_eq!(t.placement("b").await, "shard_1");
    assert_eq!(t.rows("shard_1", "b").await, (10, 20));
    assert_reversible(&t, "a", id).await;

    // Finalized, the shard drains.
    let done = t
        .mover(MoveOptions::default())
        .finalize(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.phase, Phase::Done);
    let (code, said) = cli(&["drain", "shard_1", "--apply"]).await;
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(t.batches().await, 1);
    assert_eq!(t.placement("b").await, "shard_2");
    for id in ["a", "b"] {
        assert_eq!(
            t.rows("shard_1", id).await,
            (0, 0),
            "tenant {id} on shard_1"
        );
    }
    assert_eq!(t.rows("shard_2", "b").await, (10, 20));
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn finalize_with_the_source_stopped_drops_the_way_back_on_the_target() {
    let t = Topology::with_shards("finalize-down", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 30, 2).await;
    let there = t
        .mover(reversible(None))
        .start(&tenant("a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = there.move_id;
    let name = format!("sd_move_{id}_back");
    // The source is gone (here: stopped) before the move is finalized.
    t.shard_cluster("shard_1").stop();
    let mover = t.mover(MoveOptions::default());
    let done = mover.finalize(id).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.phase, Phase::Done);
    assert!(done.finished_at.is_some() && done.keep_source);
    // What it could not drop is said, with what drops it.
    let left = done.last_error.clone().unwrap_or_default();
    for said in [
        "finalized without shard shard_1".to_owned(),
        format!("left on shard shard_1: subscription {name}"),
        format!("`shard-directory purge-source {id}`"),
    ] {
        assert!(left.contains(&said), "{left}");
    }
    // The target's slot and publication are gone: its WAL is no longer kept.
    let target = t.shard("shard_2").await;
    let slots: Vec<String> = column(
        &target,
        "SELECT slot_name::text FROM pg_replication_slots",
        &[],
    )
    .await;
    assert!(slots.is_empty(), "{slots:?}");
    let publications: Vec<String> =
        column(&target, "SELECT pubname::text FROM pg_publication", &[]).await;
    assert!(publications.is_empty(), "{publications:?}");
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_2".into(), "active".into())
    );
    assert_eq!(t.rows("shard_2", "a").await, (30, 60));

    // Back, shard_1 still holds the subscription and the rows: `cleanup` and `purge-source`
    // clear them.
    t.shard_cluster("shard_1").restart();
    assert_eq!(objects(&t).await, [format!("shard_1: subscription {name}")]);
    let dropped = mover.cleanup().await.unwrap();
    assert_eq!(
        dropped,
        [format!("subscription {name} on shard_1")],
        "{dropped:?}"
    );
    assert!(objects(&t).await.is_empty(), "{:?}", objects(&t).await);
    assert_eq!(t.rows("shard_1", "a").await, (30, 60));
    mover
        .purge_source(id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    assert_eq!(
        t.fence("shard_1", "a").await.as_deref(),
        Some("moved:shard_2")
    );
}
