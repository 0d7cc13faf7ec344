//! Moves made by a role holding exactly the grants docs/operations.md lists for the mover,
//! read from the docs themselves: preflight names each missing GRANT before anything changes, and with all of
//! them a tenant moves both ways, and a move stopped in its freeze is aborted, with nothing
//! more. The logical method's further needs are named too (PostgreSQL 15: superuser on the
//! target), and `auto` chooses copy for a role without them. A plan of many moves runs as the
//! same role.

use shard_directory_client::EntityKey;
use shard_directory_e2e::observe;
use shard_directory_e2e::topology::{documented_grants, LOGICAL_SOURCE_GRANTS};
use shard_directory_e2e::Topology;
use shard_directory_mover::{
    drain, BatchOptions, BatchState, Error, Left, Method, MethodChoice, MoveOptions, Mover,
    Outcome, Phase, Weigh,
};

fn as_mover(t: &Topology, options: MoveOptions, superuser_on: Option<&str>) -> Mover {
    t.mover_as_role(options, superuser_on)
}

fn copy() -> MoveOptions {
    MoveOptions {
        method: MethodChoice::Copy,
        ..Default::default()
    }
}

/// Asserts a move is refused, naming each of `grants`, and that nothing changed.
async fn refused_for(t: &Topology, mover: &Mover, grants: &[&str]) {
    let failure = mover
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .expect_err("a privilege is missing");
    assert!(
        matches!(failure.error, Error::Preflight { .. }) && failure.left == Left::Untouched,
        "{failure}"
    );
    let message = failure.to_string();
    for g in grants {
        assert!(message.contains(g), "{g:?} not in: {message}");
    }
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
}

#[tokio::test]
async fn a_role_holding_exactly_what_readme_lists_moves_tenants_and_nothing_less_does() {
    let t = Topology::with_shards("privileges", 2).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 5, 2).await;
    t.create_mover_role().await;
    let mover = as_mover(&t, copy(), None);
    refused_for(
        &t,
        &mover,
        &[
            "the mover's role lacks privileges on the directory",
            "GRANT USAGE ON SCHEMA shard_directory TO mover",
        ],
    )
    .await;
    let directory = documented_grants("mover grants: directory");
    t.dba().await.batch_execute(&directory).await.unwrap();
    refused_for(
        &t,
        &mover,
        &[
            "on shard shard_1",
            "GRANT USAGE ON SCHEMA shard_directory TO mover",
        ],
    )
    .await;
    let shard = documented_grants("mover grants: shard")
        .replace(
            "<each protected table>",
            "public.orders, public.order_lines",
        )
        .replace(
            "<each sequence they draw from>",
            "public.orders_order_id_seq",
        );
    // All but the sequence's grant: that one is named.
    let without_sequence: String = shard
        .lines()
        .filter(|l| !l.contains("ON public.orders_order_id_seq"))
        .collect::<Vec<_>>()
        .join("\n");
    for (name, _) in &t.shards {
        let c = t.shard(name).await;
        c.batch_execute(&without_sequence).await.unwrap();
    }
    refused_for(
        &t,
        &mover,
        &["GRANT SELECT, UPDATE ON SEQUENCE public.orders_order_id_seq TO mover"],
    )
    .await;
    for (name, _) in &t.shards {
        t.shard(name).await.batch_execute(&shard).await.unwrap();
    }

    // With exactly the documented grants: there and back, and an abort from the freeze.
    let key = EntityKey::new("tenant", "a");
    for to in ["shard_2", "shard_1"] {
        let record = mover
            .start(&key, to)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(record.phase, Phase::Done);
        assert_eq!(t.rows(to, "a").await, (5, 10));
    }
    let id = observe::crash_at(&t, copy(), &key, "shard_2", Phase::Verified).await;
    let record = mover.abort(id).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Aborted);
    assert_eq!(t.rows("shard_1", "a").await, (5, 10));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));

    // The logical method needs more, each named; `auto` makes do with copy.
    let logical = || MoveOptions {
        method: MethodChoice::Logical,
        ..Default::default()
    };
    refused_for(
        &t,
        &as_mover(&t, logical(), None),
        &[
            "ALTER ROLE mover REPLICATION",
            "GRANT CREATE ON DATABASE",
            "ALTER TABLE public.orders OWNER TO mover",
        ],
    )
    .await;
    let plan = as_mover(&t, MoveOptions::default(), None)
        .plan(&key, "shard_2")
        .await
        .unwrap();
    assert_eq!(plan.method, Method::Copy);

    // With what the docs list for it (the source's role attribute, database grant and tables;
    // PostgreSQL 15: a superuser on the target), logical moves too.
    t.shard("shard_1")
        .await
        .batch_execute(LOGICAL_SOURCE_GRANTS)
        .await
        .unwrap();
    // Paced, the mover makes the initial copy itself (the check's lock taken through a fence
    // change, the slot moved to the copy's snapshot): with the same grants. Back by copy.
    let paced = MoveOptions {
        max_rate: Some(1_000),
        ..logical()
    };
    let moved_logically = async |options: MoveOptions| {
        let record = as_mover(&t, options, Some("shard_2"))
            .start(&key, "shard_2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (record.phase, record.method),
            (Phase::Done, Method::Logical)
        );
        assert_eq!(t.rows("shard_2", "a").await, (5, 10));
        assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    };
    moved_logically(paced).await;
    let record = mover
        .start(&key, "shard_1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    moved_logically(logical()).await;

    // A plan of many moves, by copy, as the role with only the documented grants: the fleet's
    // sizes and freeze estimates read, the batch recorded and run.
    let fleet = mover.fleet(false).await.unwrap_or_else(|e| panic!("{e}"));
    let plan = drain(&fleet, "shard_2", &[], Weigh::Rows).unwrap();
    assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
    let one = BatchOptions {
        parallel: 1,
        per_shard: 1,
    };
    let batch = mover.record_batch(&plan, one).await.unwrap();
    let run = mover.resume_batch(batch).await.unwrap();
    assert!(run.stopped.is_none(), "{:?}", run.stopped);
    match &run.moves[..] {
        [(_, Outcome::Moved(record))] => assert_eq!(record.phase, Phase::Done),
        other => panic!("{other:?}"),
    }
    let status = mover.batch_status(batch).await.unwrap();
    assert_eq!(status.state, BatchState::Done);
    assert_eq!(t.rows("shard_1", "a").await, (5, 10));
}
