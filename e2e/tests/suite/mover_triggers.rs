//! The target's own triggers and the rows a move writes there: those rows were processed on their
//! source, so neither the copy nor logical apply runs them through the target's triggers again (a
//! counter would count them twice). A copy whose role may not set `session_replication_role` is
//! refused before it changes anything, naming the trigger and the GRANT; what the copied rows
//! reference is still checked.

use shard_directory_client::EntityKey;
use shard_directory_e2e::topology::documented_grants;
use shard_directory_e2e::Topology;
use shard_directory_mover::{Error, Left, MethodChoice, MoveOptions, Phase};
use tokio_postgres::error::SqlState;

/// A counter of the rows inserted, for an ordinary AFTER INSERT row trigger whose function names
/// its table unqualified, as nearly everyone writes it.
const COUNTER: &str = "
    CREATE TABLE row_count (n bigint NOT NULL);
    INSERT INTO row_count VALUES (0);
    CREATE FUNCTION count_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE row_count SET n = n + 1;
        RETURN NULL;
    END $$;";

/// The counter's trigger on `table`, `count_<table>`.
fn counting(table: &str) -> String {
    format!(
        "CREATE TRIGGER count_{table} AFTER INSERT ON {table} FOR EACH ROW \
         EXECUTE FUNCTION count_row();"
    )
}

fn method(method: MethodChoice) -> MoveOptions {
    MoveOptions {
        method,
        ..Default::default()
    }
}

/// What the trigger counted on `shard`.
async fn counted(t: &Topology, shard: &str) -> i64 {
    t.count(shard, "SELECT n FROM row_count").await
}

/// Moves tenant `a` to `to`, every row arriving; the target's counter is what it was.
async fn moves_uncounted(t: &Topology, options: MoveOptions, from: &str, to: &str) {
    let before = counted(t, to).await;
    let what = format!(
        "{:?} (paced: {:?}) to {to}",
        options.method, options.max_rate
    );
    let record = t
        .mover(options)
        .start(&EntityKey::new("tenant", "a"), to)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(record.phase, Phase::Done, "{what}");
    assert_eq!(t.rows(to, "a").await, (20, 20), "{what}: every row there");
    assert_eq!(t.rows(from, "a").await, (0, 0), "{what}: none left");
    assert_eq!(
        counted(t, to).await,
        before,
        "{what}: the counter unchanged"
    );
}

#[tokio::test]
async fn neither_a_copy_nor_logical_apply_runs_the_rows_through_the_targets_counter_trigger() {
    let t = Topology::start("triggers").await;
    t.on_every_shard(&format!("{COUNTER} {}", counting("orders")))
        .await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 1).await;
    assert_eq!(counted(&t, "shard_1").await, 20, "the source counted them");
    let paced = MoveOptions {
        max_rate: Some(10_000),
        ..method(MethodChoice::Logical)
    };
    // The copy under the freeze; logical apply; the mover's own paced initial copy.
    moves_uncounted(&t, method(MethodChoice::Copy), "shard_1", "shard_2").await;
    moves_uncounted(&t, method(MethodChoice::Logical), "shard_2", "shard_1").await;
    moves_uncounted(&t, paced, "shard_1", "shard_2").await;
    // The trigger is on as before for the application's writes.
    let router = t.connected_router().await;
    Topology::order(&router, "a", "after the moves")
        .await
        .unwrap();
    assert_eq!(counted(&t, "shard_2").await, 1);
}

/// A copy as a role holding the documented grants and no more: refused in preflight, naming the
/// trigger and what to grant (the parameter, and SELECT on what the rows reference, which the
/// mover checks itself under replica), with nothing left behind; with the grants docs/operations.md
/// lists for such a target it moves.
#[tokio::test]
async fn a_copy_by_a_role_that_may_not_skip_the_targets_triggers_is_refused_before_anything_changes(
) {
    let t = Topology::start("triggerrole").await;
    t.on_every_shard(&format!(
        "{COUNTER} {}
             CREATE TABLE regions (region text PRIMARY KEY);
             ALTER TABLE orders ADD COLUMN region text REFERENCES regions;",
        counting("orders")
    ))
    .await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 5, 2).await;
    t.create_mover_role().await;
    t.grant_mover_as_readme_lists(
        "public.orders, public.order_lines",
        "public.orders_order_id_seq",
    )
    .await;
    let key = EntityKey::new("tenant", "a");
    let mover = t.mover_as_role(method(MethodChoice::Copy), None);
    let failure = mover
        .start(&key, "shard_2")
        .await
        .expect_err("preflight refuses");
    assert!(
        matches!(failure.error, Error::Preflight { .. }) && failure.left == Left::Untouched,
        "{failure}"
    );
    let message = failure.to_string();
    for part in [
        "target shard shard_2 has trigger count_orders on public.orders",
        "session_replication_role = replica",
        "GRANT SET ON PARAMETER session_replication_role TO mover",
        "GRANT SELECT ON TABLE public.regions TO mover",
        "on shard shard_2",
    ] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(
        t.step("SELECT count(*) FROM shard_directory.shard_moves")
            .await,
        0,
        "no move recorded"
    );
    assert_eq!(
        (t.fence("shard_1", "a").await, t.fence("shard_2", "a").await),
        (None, None),
        "no fence changed"
    );
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));

    let grants = documented_grants("mover grants: target with triggers").replace(
        "<each table the protected tables reference>",
        "public.regions",
    );
    t.shard("shard_2")
        .await
        .batch_execute(&grants)
        .await
        .unwrap();
    let record = mover
        .start(&key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(t.rows("shard_2", "a").await, (5, 10));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    assert_eq!(counted(&t, "shard_2").await, 0, "the counter unchanged");
}

/// A row whose reference the target lacks: the copy's COPY refuses it through the foreign key;
/// made as replica (the cart has a trigger of its own), the copy checks no foreign key, and the
/// mover finds the row itself. Either way the move is aborted, and goes through once the
/// referenced row is there.
#[tokio::test]
async fn a_copy_that_skips_the_targets_triggers_still_refuses_a_row_whose_reference_is_missing() {
    let t = Topology::start("triggerref").await;
    t.on_every_shard(&format!(
        "{COUNTER}
             CREATE TABLE products (sku text PRIMARY KEY);
             CREATE TABLE cart (tenant_id text NOT NULL, sku text NOT NULL REFERENCES products,
                                PRIMARY KEY (tenant_id, sku));
             SELECT shard_directory.protect('cart', 'tenant_id', 'tenant');
             INSERT INTO products VALUES ('everywhere');"
    ))
    .await;
    t.shard("shard_1")
        .await
        .batch_execute("INSERT INTO products VALUES ('only-here')")
        .await
        .unwrap();
    t.add_tenant("a", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO cart VALUES ('a', 'everywhere'), ('a', 'only-here')",
    )
    .await
    .unwrap();
    let key = EntityKey::new("tenant", "a");
    let cart = "SELECT count(*) FROM cart WHERE tenant_id = 'a'";
    let aborted_as_it_was = async |failure: &shard_directory_mover::Failure| {
        assert_eq!(failure.left, Left::Aborted, "{failure}");
        assert_eq!(
            t.entry("tenant", "a").await,
            ("shard_1".into(), "active".into())
        );
        assert_eq!(
            (t.fence("shard_1", "a").await, t.fence("shard_2", "a").await),
            (None, None)
        );
        assert_eq!(
            (
                t.count("shard_1", cart).await,
                t.count("shard_2", cart).await
            ),
            (2, 0)
        );
    };

    // No table of the tenant's has a trigger of its own: COPY checks the foreign key.
    let failure = t
        .mover(method(MethodChoice::Copy))
        .start(&key, "shard_2")
        .await
        .expect_err("the reference is missing on the target");
    assert!(
        matches!(&failure.error, Error::Db { source, .. }
            if source.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION)),
        "{failure}"
    );
    aborted_as_it_was(&failure).await;

    // With one, the copy runs as replica, and the mover checks the reference.
    t.on_every_shard(&counting("cart")).await;
    let failure = t
        .mover(method(MethodChoice::Copy))
        .start(&key, "shard_2")
        .await
        .expect_err("the reference is missing on the target");
    assert!(
        matches!(&failure.error, Error::MissingReference { shard, constraint, rows, .. }
            if shard == "shard_2" && constraint == "cart_sku_fkey" && rows == &["(a,only-here)"]),
        "{failure}"
    );
    aborted_as_it_was(&failure).await;

    t.shard("shard_2")
        .await
        .batch_execute("INSERT INTO products VALUES ('only-here')")
        .await
        .unwrap();
    let record = t
        .mover(method(MethodChoice::Copy))
        .start(&key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(
        (
            t.count("shard_2", cart).await,
            t.count("shard_1", cart).await
        ),
        (2, 0)
    );
    assert_eq!(counted(&t, "shard_2").await, 0, "the counter unchanged");
}

/// An abort takes the move's rows off the target as they came: without firing the target's
/// triggers (an AFTER DELETE counter would count rows the AFTER INSERT one never counted), for a
/// copy and for logical apply alike; and a finished move takes them off the source so too.
#[tokio::test]
async fn an_abort_takes_the_rows_away_without_the_targets_triggers() {
    let t = Topology::start("triggerabort").await;
    t.on_every_shard(&format!(
        "{COUNTER} {}
             CREATE FUNCTION uncount_row() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 UPDATE row_count SET n = n - 1;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER uncount_orders AFTER DELETE ON orders FOR EACH ROW
                 EXECUTE FUNCTION uncount_row();",
        counting("orders")
    ))
    .await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 1).await;
    let key = EntityKey::new("tenant", "a");
    for how in [MethodChoice::Copy, MethodChoice::Logical] {
        let id = shard_directory_e2e::observe::crash_at(
            &t,
            method(how),
            &key,
            "shard_2",
            Phase::Verified,
        )
        .await;
        assert_eq!(t.rows("shard_2", "a").await, (20, 20), "{how:?}: copied");
        let record = t.mover(method(how)).abort(id).await.unwrap();
        assert_eq!(record.phase, Phase::Aborted, "{how:?}");
        assert_eq!(t.rows("shard_2", "a").await, (0, 0), "{how:?}: taken away");
        assert_eq!(
            counted(&t, "shard_2").await,
            0,
            "{how:?}: the counter unchanged"
        );
        assert_eq!(
            counted(&t, "shard_1").await,
            20,
            "{how:?}: the source's too"
        );
    }
    // Moved for good: the source's rows leave without its AFTER DELETE trigger either.
    let record = t
        .mover(method(MethodChoice::Copy))
        .start(&key, "shard_2")
        .await
        .unwrap();
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(
        (t.rows("shard_1", "a").await, t.rows("shard_2", "a").await),
        ((0, 0), (20, 20))
    );
    assert_eq!(
        (counted(&t, "shard_1").await, counted(&t, "shard_2").await),
        (20, 0)
    );
}
