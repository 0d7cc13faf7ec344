//! The `shard-directory` CLI as an operator uses it: a dry run, a move with progress lines,
//! `status --json` for scripts, `list`, `where` (now and at a time), `history`, `cleanup`, and
//! its exit codes (0 done, 1 failed, 2 bad usage).

use std::process::Output;

use serde_json::Value;
use shard_directory_e2e::{mover_cli, Topology};

async fn cli(t: Option<&Topology>, args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(mover_cli::binary());
    c.args(args).env_remove("SHARD_DIRECTORY_URL");
    if let Some(t) = t {
        c.env("SHARD_DIRECTORY_URL", t.directory.conn_str("directory"));
    }
    c.output().await.expect("run shard-directory")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
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
}
