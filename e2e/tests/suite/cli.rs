//! The `shard-directory` CLI as an operator uses it: a dry run, a move with progress lines,
//! `status --json` for scripts, `list`, `where` (now and at a time), `history`, `cleanup`, and
//! its exit codes (0 done, 1 failed and nothing left to do, 2 bad usage, 3 left resumable, 4
//! busy), and a move stopped by SIGINT.

use std::process::Output;

use serde_json::Value;
use shard_directory_e2e::mover_cli::{self, succeeded, text};
use shard_directory_e2e::Topology;
use shard_directory_mover::Phase;

async fn cli(t: Option<&Topology>, args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(mover_cli::binary());
    c.args(args).env_remove("SHARD_DIRECTORY_URL");
    if let Some(t) = t {
        c.env("SHARD_DIRECTORY_URL", t.directory.conn_str("directory"));
    }
    c.output().await.expect("run shard-directory")
}

#[tokio::test]
async fn an_operator_moves_a_tenant_and_follows_it_with_the_cli() {
    let usage = cli(None, &["list"]).await;
    assert_eq!(usage.status.code(), Some(2));
    assert!(text(&usage.stderr).contains("--directory or SHARD_DIRECTORY_URL"));
    assert_eq!(cli(None, &["frobnicate"]).await.status.code(), Some(2));

    let t = Topology::start("cli").await;
    t.add_tenant("8842", "shard_1").await;
    let before_move: String = t
        .dba()
        .await
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    t.shard("shard_1")
        .await
        .batch_execute(
            "BEGIN; SELECT set_config('app.directory_version', '1', true);
             INSERT INTO orders (tenant_id, item) VALUES ('8842', 'book'), ('8842', 'pen'); COMMIT",
        )
        .await
        .unwrap();

    let refused = cli(Some(&t), &["move", "tenant", "8842", "--to", "shard_9"]).await;
    assert_eq!(refused.status.code(), Some(1));
    let message = text(&refused.stderr);
    assert!(
        message.contains("shard \"shard_9\" is not in shard_directory.shards"),
        "{message}"
    );
    assert!(message.contains("nothing was changed"), "{message}");

    // --config overrides where a shard is: here an address where nothing listens.
    let config = std::env::temp_dir().join(format!("sd-cli-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[shards.shard_2]\nconninfo = \"host=127.0.0.1 port=1 dbname=app user=postgres\"\n",
    )
    .unwrap();
    let overridden = cli(
        Some(&t),
        &[
            "--config",
            config.to_str().unwrap(),
            "move",
            "tenant",
            "8842",
            "--to",
            "shard_2",
            "--dry-run",
        ],
    )
    .await;
    std::fs::remove_file(&config).unwrap();
    assert_eq!(overridden.status.code(), Some(1));
    assert!(
        text(&overridden.stderr).contains("connect: shard shard_2"),
        "{}",
        text(&overridden.stderr)
    );

    let plan = succeeded(
        &cli(
            Some(&t),
            &["move", "tenant", "8842", "--to", "shard_2", "--dry-run"],
        )
        .await,
    );
    assert!(
        plan.contains("move tenant/8842 from shard_1 to shard_2 by logical copy"),
        "{plan}"
    );
    assert!(plan.contains("public.orders: 2 rows"), "{plan}");
    assert!(
        plan.contains("estimate: comparing every row: about"),
        "{plan}"
    );
    assert!(
        plan.contains("estimate: the freeze: a catch-up and the rows changed since"),
        "{plan}"
    );
    assert!(!plan.contains("would outlast"), "{plan}");
    // Every command's result as one JSON value with --json: the plan too.
    let plan: Value = serde_json::from_str(&succeeded(
        &cli(
            Some(&t),
            &[
                "move",
                "tenant",
                "8842",
                "--to",
                "shard_2",
                "--dry-run",
                "--json",
            ],
        )
        .await,
    ))
    .unwrap();
    assert_eq!(
        (&plan["source"], &plan["target"], &plan["tables"][0]),
        (
            &serde_json::json!("shard_1"),
            &serde_json::json!("shard_2"),
            &serde_json::json!(["public.orders", 2])
        ),
        "{plan}"
    );
    // A copy-method freeze cannot fit in a nanosecond: the plan says so, with the fix.
    let args = "move tenant 8842 --to shard_2 --dry-run --method copy --max-freeze 1ns";
    let tight = succeeded(&cli(Some(&t), &args.split(' ').collect::<Vec<_>>()).await);
    assert!(
        tight.contains(
            "warning: the freeze would outlast --max-freeze (0 ms): it would be undone and the \
             move would fail; fix: use --method logical, or raise --max-freeze"
        ),
        "{tight}"
    );
    assert!(
        succeeded(&cli(Some(&t), &["list"]).await).is_empty(),
        "a dry run records nothing"
    );

    let moved = cli(
        Some(&t),
        &[
            "move",
            "tenant",
            "8842",
            "--to",
            "shard_2",
            "--method",
            "copy",
            "--max-freeze",
            "5s",
        ],
    )
    .await;
    let summary = succeeded(&moved);
    assert!(
        summary.starts_with("move 1 done: tenant/8842 shard_1 -> shard_2 by copy"),
        "{summary}"
    );
    assert!(
        summary.contains("public.orders: 2 rows, copied 2, verified 2, deleted on source 2"),
        "{summary}"
    );
    // Not a terminal: plain progress lines on stderr, one per phase.
    let progress = text(&moved.stderr);
    for phase in [
        "migrating",
        "frozen",
        "verified",
        "cutover",
        "cleaning_up",
        "done",
    ] {
        assert!(
            progress.contains(&format!("move 1: {phase}\n")),
            "{progress}"
        );
    }

    let status: Value =
        serde_json::from_str(&succeeded(&cli(Some(&t), &["status", "1", "--json"]).await)).unwrap();
    assert_eq!(status["phase"], "done");
    assert_eq!(status["method"], "copy");
    assert_eq!(status["max_freeze_ms"], 5000);
    assert_eq!(status["source_fence"], serde_json::json!({"state": "none"}));
    assert_eq!(status["tables"]["public.orders"]["rows"], 2);
    assert!(status["cutover_version"].as_i64() > status["freeze_version"].as_i64());
    assert!(status["max_freeze_seen_ms"].is_i64());
    assert!(status["finished_at"].as_str().unwrap().ends_with('Z'));
    for key in [
        "move_id",
        "entity_type",
        "entity_id",
        "source_shard",
        "target_shard",
        "replication_name",
        "started_by",
        "started_at",
        "last_error",
        "catchup_lsn",
    ] {
        assert!(status.get(key).is_some(), "status --json has {key}");
    }
    assert_eq!(
        succeeded(&cli(Some(&t), &["status"]).await),
        "no open moves\n"
    );
    assert!(succeeded(&cli(Some(&t), &["list"]).await).contains("done"));

    let now = succeeded(&cli(Some(&t), &["where", "tenant", "8842"]).await);
    assert!(
        now.starts_with("tenant/8842: shard_2 (active, version"),
        "{now}"
    );
    let then = succeeded(&cli(Some(&t), &["where", "tenant", "8842", "--at", &before_move]).await);
    assert_eq!(then, format!("tenant/8842 at {before_move}: shard_1\n"));
    let json = |args: &'static [&'static str]| {
        let t = &t;
        async move {
            let out = succeeded(&cli(Some(t), args).await);
            serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
        }
    };
    let now = json(&["where", "tenant", "8842", "--json"]).await;
    assert_eq!(now["shard_name"], "shard_2", "{now}");
    assert!(now["version"].as_i64().is_some(), "{now}");
    let at = ["where", "tenant", "8842", "--at", &before_move, "--json"];
    let then: Value = serde_json::from_str(&succeeded(&cli(Some(&t), &at).await)).unwrap();
    assert_eq!(
        (&then["entity_id"], &then["shard"]),
        (&serde_json::json!("8842"), &serde_json::json!("shard_1")),
        "{then}"
    );
    let history = succeeded(&cli(Some(&t), &["history", "tenant", "8842"]).await);
    for step in ["insert", "begin_move", "freeze", "cutover"] {
        assert!(history.contains(step), "{history}");
    }

    // On a terminal (here a pseudo-terminal from script(1)): progress bars, rows per table.
    let back = format!(
        "{} move tenant 8842 --to shard_1 --method copy",
        mover_cli::binary().display()
    );
    let tty = tokio::process::Command::new("script")
        .args(["-qec", &back, "/dev/null"])
        .env("SHARD_DIRECTORY_URL", t.directory.conn_str("directory"))
        .output()
        .await
        .expect("run script(1)");
    let screen = text(&tty.stdout);
    assert!(tty.status.success(), "{screen}");
    assert!(
        screen.contains("public.orders [") && screen.contains("] 2/2 rows"),
        "{screen}"
    );

    let done = cli(Some(&t), &["abort", "1"]).await;
    assert_eq!(done.status.code(), Some(1));
    assert!(
        text(&done.stderr).contains("the move is done"),
        "{}",
        text(&done.stderr)
    );
    assert_eq!(
        succeeded(&cli(Some(&t), &["cleanup"]).await),
        "nothing to clean up\n"
    );
    assert_eq!(json(&["cleanup", "--json"]).await, serde_json::json!([]));
}

/// Waits until the CLI's move of tenant `id` says `phase` (and, with `caught_up`, has taken its
/// catch-up position, so it is waiting for the target).
async fn until_phase(t: &Topology, id: &str, phase: Phase, waiting_for_target: bool) -> i64 {
    shard_directory_e2e::eventually(
        &format!("the move to reach {phase}"),
        std::time::Duration::from_secs(30),
        || async {
            let row = t
                .dba()
                .await
                .query_opt(
                    "SELECT move_id, phase, catchup_lsn IS NOT NULL FROM shard_directory.shard_moves \
                     WHERE entity_id = $1 AND finished_at IS NULL",
                    &[&id],
                )
                .await
                .unwrap()?;
            let (move_id, at, caught): (i64, String, bool) = (row.get(0), row.get(1), row.get(2));
            (at == phase.as_str() && (caught || !waiting_for_target)).then_some(move_id)
        },
    )
    .await
}

fn interrupt(child: &tokio::process::Child) {
    let pid = child.id().expect("the CLI runs").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[tokio::test]
async fn an_interrupted_move_is_aborted_before_its_cutover_and_finished_after_it() {
    let t = Topology::start("cli-signals").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 1).await;
    // The copy into the target waits on a lock: the move waits in the freeze.
    let locker = t.shard("shard_2").await;
    locker
        .batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let child = mover_cli::command(&t)
        .args(["move", "tenant", "a", "--to", "shard_2", "--method", "copy"])
        .args(["--max-freeze", "60s"])
        .spawn()
        .unwrap();
    until_phase(&t, "a", Phase::Frozen, false).await;
    interrupt(&child);
    locker.batch_execute("ROLLBACK").await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("interrupted") && stderr.contains("was aborted"),
        "{stderr}"
    );
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "active".into())
    );
    assert_eq!(t.fence("shard_1", "a").await, None);
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    Topology::order(&t.connected_router().await, "a", "after the interrupt")
        .await
        .expect("writable on its source");

    // After the cutover: the source's delete waits on a lock; interrupted, the move finishes.
    let locker = t.shard("shard_1").await;
    locker
        .batch_execute("BEGIN; LOCK TABLE order_lines IN SHARE MODE")
        .await
        .unwrap();
    let child = mover_cli::command(&t)
        .args(["move", "tenant", "a", "--to", "shard_2", "--method", "copy"])
        .spawn()
        .unwrap();
    until_phase(&t, "a", Phase::CleaningUp, false).await;
    interrupt(&child);
    locker.batch_execute("ROLLBACK").await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("finishing it"), "{stderr}");
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_2".into(), "active".into())
    );
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
    assert_eq!(t.rows("shard_2", "a").await, (21, 20));
}

#[tokio::test]
async fn exit_codes_and_json_say_how_a_move_was_left() {
    let t = Topology::start("cli-codes").await;
    for id in ["a", "b", "k"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 3, 1).await;
    }
    // 3: stopped resumable (a checked transaction left open on the source holds the freeze).
    let (blocker, _) = t.idle_checked_transaction("shard_1").await;
    let out = cli(
        Some(&t),
        &[
            "--json",
            "--fence-wait",
            "1s",
            "move",
            "tenant",
            "a",
            "--to",
            "shard_2",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let failed: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(failed["left"], "resumable");
    assert_eq!(failed["phase"], "catching_up");
    assert!(failed["error"]
        .as_str()
        .unwrap()
        .contains("transactions in progress"));
    blocker.batch_execute("COMMIT").await.unwrap();
    let id = failed["move_id"].as_i64().unwrap();

    // 4: busy, naming who holds the move.
    let held =
        shard_directory_e2e::observe::act_at(Phase::Frozen, || Box::pin(std::future::pending()));
    let mover = t.mover(Default::default()).with_observer(held);
    let holding = tokio::spawn(async move { mover.resume(id).await });
    until_phase(&t, "a", Phase::Frozen, false).await;
    let out = cli(Some(&t), &["abort", &id.to_string()]).await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is being run by another process: pid"));
    let status: Value = serde_json::from_str(&succeeded(
        &cli(Some(&t), &["status", &id.to_string(), "--json"]).await,
    ))
    .unwrap();
    assert_eq!(status["schema_version"], 1);
    assert_eq!(status["phase"], "frozen");
    assert!(status["driver"]["pid"].as_i64().is_some(), "{status}");
    assert!(
        status["slot"]["retained_wal_bytes"].as_i64().is_some(),
        "{status}"
    );
    assert_eq!(
        status["last_error"],
        Value::Null,
        "cleared by the steps since"
    );
    let open: Value = serde_json::from_str(&succeeded(
        &cli(Some(&t), &["list", "--open", "--json"]).await,
    ))
    .unwrap();
    assert_eq!(open.as_array().unwrap().len(), 1);
    let later: Value = serde_json::from_str(&succeeded(
        &cli(Some(&t), &["list", "--since", "2999-01-01", "--json"]).await,
    ))
    .unwrap();
    assert!(later.as_array().unwrap().is_empty());
    holding.abort();
    let _ = holding.await;
    let record: Value = serde_json::from_str(&succeeded(
        &cli(Some(&t), &["resume", &id.to_string(), "--json"]).await,
    ))
    .unwrap();
    assert_eq!(record["phase"], "done");

    // 1: refused before anything changed.
    let out = cli(Some(&t), &["move", "tenant", "b", "--to", "shard_9"]).await;
    assert_eq!(out.status.code(), Some(1));

    // --keep-source leaves the rows fenced on the source; purge-source deletes them.
    let kept = succeeded(
        &cli(
            Some(&t),
            &[
                "move",
                "tenant",
                "k",
                "--to",
                "shard_2",
                "--method",
                "copy",
                "--keep-source",
            ],
        )
        .await,
    );
    let kept_id: i64 = kept
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("move <id> done");
    assert_eq!(t.rows("shard_1", "k").await, (3, 3));
    succeeded(&cli(Some(&t), &["purge-source", &kept_id.to_string()]).await);
    assert_eq!(t.rows("shard_1", "k").await, (0, 0));
    assert_eq!(t.rows("shard_2", "k").await, (3, 3));
    let again = cli(Some(&t), &["purge-source", &id.to_string()]).await;
    assert_eq!(again.status.code(), Some(1), "not a --keep-source move");
}

#[tokio::test]
async fn verify_finds_rows_out_of_place_and_compares_an_entity_between_shards() {
    let t = Topology::start("cli-verify").await;
    // Order ids come from one sequence: home's are 1-4, kept's 5-8.
    for id in ["home", "kept"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 4, 1).await;
    }
    let clean = cli(Some(&t), &["verify", "shard", "shard_1"]).await;
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stderr));
    assert!(text(&clean.stdout).contains("every row on shard_1 is where the directory says"));

    succeeded(
        &cli(
            Some(&t),
            &[
                "move",
                "tenant",
                "kept",
                "--to",
                "shard_2",
                "--method",
                "copy",
                "--keep-source",
            ],
        )
        .await,
    );
    // Rows a superuser wrote behind every check: of a tenant with no entry at all.
    t.shard("shard_1")
        .await
        .batch_execute(
            "BEGIN; SET LOCAL session_replication_role = replica;
             INSERT INTO orders (tenant_id, item, order_id) VALUES ('ghost', 'x', 1); COMMIT",
        )
        .await
        .unwrap();
    let found = cli(Some(&t), &["verify", "shard", "shard_1"]).await;
    assert_eq!(found.status.code(), Some(5), "{}", text(&found.stderr));
    let report = text(&found.stdout);
    assert!(
        report.contains("tenant/kept has rows on shard_1 (public.order_lines: 4, public.orders: 4), fenced moved to shard_2")
            && report.contains("the directory places it on shard_2 (active)"),
        "{report}"
    );
    assert!(
        report.contains("tenant/ghost has rows on shard_1 (public.orders: 1)")
            && report.contains("has no entry for it"),
        "{report}"
    );
    assert!(!report.contains("tenant/home"), "{report}");
    assert_eq!(
        cli(Some(&t), &["verify", "shard", "shard_2"])
            .await
            .status
            .code(),
        Some(0)
    );

    let same = cli(
        Some(&t),
        &["verify", "entity", "tenant", "kept", "--against", "shard_1"],
    )
    .await;
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    assert!(text(&same.stdout).contains("tenant/kept: the same rows on shard_1"));
    let same = cli(
        Some(&t),
        &[
            "verify",
            "entity",
            "tenant",
            "kept",
            "--against",
            "shard_1",
            "--json",
        ],
    )
    .await;
    let same: Value = serde_json::from_str(&text(&same.stdout)).unwrap();
    assert_eq!(same["against"], "shard_1", "{same}");
    assert!(
        same["rows"]
            .as_array()
            .is_some_and(|rows| rows.contains(&serde_json::json!(["public.orders", 4]))),
        "{same}"
    );
    t.shard("shard_1")
        .await
        .batch_execute(
            "BEGIN; SET LOCAL session_replication_role = replica;
             UPDATE orders SET item = 'changed' WHERE tenant_id = 'kept' AND order_id = 5; COMMIT",
        )
        .await
        .unwrap();
    let differs = cli(
        Some(&t),
        &["verify", "entity", "tenant", "kept", "--against", "shard_1"],
    )
    .await;
    assert_eq!(differs.status.code(), Some(5), "{}", text(&differs.stderr));
    assert!(
        text(&differs.stderr).contains("table public.orders differs")
            && text(&differs.stderr).contains("(kept,5)"),
        "{}",
        text(&differs.stderr)
    );
}
