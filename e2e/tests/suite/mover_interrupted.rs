//! Moves interrupted where no other test chose to (issue 41's cases, each at a named failpoint of
//! the mover, `mover/src/failpoint.rs`): an aborted move is never reported as a success; a mover
//! killed inside its own abort, a source restarting in the freeze, a check that overruns the
//! freeze and a directory blip never leave a tenant refusing writes past its lease; a paced copy
//! resumed without its pace starts from a target without its rows. The failpoint sweep
//! (`sweep.rs`) checks the same invariants everywhere; these pin each case by name.

use std::time::{Duration, Instant};

use serde_json::Value;
use shard_directory_client::{DirectoryConfig, EntityKey, RetryPolicy};
use shard_directory_e2e::mover_cli::{command, open_phase, text, Held};
use shard_directory_e2e::observe::act_at;
use shard_directory_e2e::proxy::Proxy;
use shard_directory_e2e::topology::DIRECTORY_DB;
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{Left, MethodChoice, MoveOptions, Mover, Overrides, Phase};

const DEADLINE: Duration = Duration::from_secs(30);
/// What every command here runs with; moves add `--max-freeze 1s`: a lease of 2 s.
const TUNING: [&str; 4] = ["--lease-grace", "1s", "--directory-patience", "20s"];

/// A topology with tenant `a` (20 orders of 2 lines) on shard_1; its commits survive a crash.
async fn with_tenant(name: &str) -> Topology {
    let t = Topology::durable(name).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 20, 2).await;
    t
}

/// `shard-directory <args> --json` with the tuning above, `FAILPOINTS` set to `failpoints`.
async fn cli(t: &Topology, args: &[&str], failpoints: &str) -> (Option<i32>, Value, String) {
    let out = command(t)
        .args(args)
        .args(["--json"])
        .args(TUNING)
        .env("FAILPOINTS", failpoints)
        .output()
        .await
        .expect("run shard-directory");
    let json = serde_json::from_str(&text(&out.stdout)).unwrap_or(Value::Null);
    (out.status.code(), json, text(&out.stderr))
}

/// `move` of tenant `a` to shard_2 by `method` (a lease of 2 s), and `more`.
fn move_of<'a>(method: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "move",
        "tenant",
        "a",
        "--to",
        "shard_2",
        "--method",
        method,
        "--max-freeze",
        "1s",
    ];
    args.extend(more);
    args
}

/// Moves tenant `a` to shard_2 by `method`, killing the mover at failpoint `at`; the move's id.
async fn killed_at(t: &Topology, method: &str, at: &str) -> i64 {
    let args = move_of(method, &[]);
    let (code, _, stderr) = cli(t, &args, &format!("{at}=return(kill)")).await;
    assert_eq!(code, None, "killed at {at}: {stderr}");
    open_phase(t, "a").await.expect("the killed move is open").0
}

/// Waits (up to `deadline`) for an order of tenant `a` to commit through a router that waits
/// out freezes; how long that took.
async fn writes_within(t: &Topology, deadline: Duration) -> Duration {
    let router = t
        .router(t.client_directory(DirectoryConfig::default()).await)
        .with_retry(RetryPolicy::default().deadline(deadline));
    let started = Instant::now();
    Topology::order(&router, "a", &format!("after {:?}", Instant::now()))
        .await
        .unwrap_or_else(|e| panic!("tenant a took no write within {deadline:?}: {e}"));
    started.elapsed()
}

fn active_on(shard: &str) -> (String, String) {
    (shard.to_owned(), "active".to_owned())
}

/// Issue 41, item 1: `resume` of a move its lease released finishes the abort and says so
/// (exit 1, `left: aborted`), as the directory says: the tenant never left shard_1.
#[tokio::test]
async fn a_resumed_move_that_ends_aborted_is_reported_as_aborted() {
    let t = with_tenant("resume-aborted").await;
    let id = killed_at(&t, "logical", "enter.verified").await;
    writes_within(&t, DEADLINE).await;
    assert_eq!(open_phase(&t, "a").await, Some((id, Phase::Aborting)));
    let (code, json, stderr) = cli(&t, &["resume", &id.to_string()], "").await;
    assert_eq!(code, Some(1), "{json} {stderr}");
    assert_eq!(
        (json["left"].as_str(), json["phase"].as_str()),
        (Some("aborted"), Some("aborted")),
        "{json}"
    );
    assert!(stderr.contains("was aborted"), "{stderr}");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
}

/// Issue 41, item 1: a move that waits out a directory outage longer than its freeze's lease
/// does not go on with the freeze: it aborts and says so, exit 1.
#[tokio::test]
async fn a_move_that_outlives_its_lease_in_a_directory_outage_aborts_and_says_so() {
    let t = with_tenant("outage-aborted").await;
    let held = Held::new("outage-aborted");
    let args = move_of("copy", &[]);
    let failpoint = held.at("copy.commit.Copy");
    let moving = cli(&t, &args, &failpoint);
    let outage = async {
        held.reached().await;
        t.directory.stop();
        held.release();
        // Past the lease (2 s) with the directory down: no router can release the tenant.
        tokio::time::sleep(Duration::from_secs(3)).await;
        t.directory.restart();
    };
    let ((code, json, stderr), ()) = tokio::join!(moving, outage);
    assert_eq!(code, Some(1), "{json} {stderr}");
    assert_eq!(json["left"].as_str(), Some("aborted"), "{json}");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
    assert_eq!(t.rows("shard_1", "a").await, (20, 40));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
}

/// Issue 41, item 2: a mover killed inside its own abort (the directory already released) leaves
/// the tenant writable without a person within the lease; `abort` again finishes the cleanup.
#[tokio::test]
async fn a_mover_killed_inside_its_abort_leaves_the_tenant_writable() {
    let t = with_tenant("killed-in-abort").await;
    let id = killed_at(&t, "logical", "enter.verified").await;
    let (code, _, stderr) = cli(
        &t,
        &["abort", &id.to_string()],
        "abort.end_sessions.source=return(kill)",
    )
    .await;
    assert_eq!(code, None, "killed in its abort: {stderr}");
    let took = writes_within(&t, DEADLINE).await;
    assert!(took < Duration::from_secs(6), "writable after {took:?}");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
    let (code, json, stderr) = cli(&t, &["abort", &id.to_string()], "").await;
    assert_eq!(code, Some(0), "{json} {stderr}");
    assert_eq!(json["phase"].as_str(), Some("aborted"));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert_eq!(t.fence("shard_1", "a").await, None);
    assert_eq!(t.replication_objects().await, Vec::<String>::new());
}

/// Issue 41, item 3: the source restarts while the tenant is frozen; nothing is killed. The
/// mover's abort connects again and finishes: exit 1, `aborted`, the tenant writable on shard_1
/// and none of its rows left on shard_2.
#[tokio::test]
async fn a_source_restart_in_the_freeze_is_aborted_to_the_end() {
    let t = with_tenant("source-restart").await;
    let held = Held::new("source-restart");
    let args = move_of("logical", &[]);
    let failpoint = held.at("enter.verified");
    let moving = cli(&t, &args, &failpoint);
    let restart = async {
        held.reached().await;
        let source = t.shard_cluster("shard_1");
        source.crash();
        source.restart();
        held.release();
    };
    let ((code, json, stderr), ()) = tokio::join!(moving, restart);
    assert_eq!(code, Some(1), "{json} {stderr}");
    assert_eq!(json["left"].as_str(), Some("aborted"), "{json} {stderr}");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
    writes_within(&t, Duration::from_secs(5)).await;
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
    assert_eq!(t.fence("shard_1", "a").await, None);
}

/// Issue 41, item 4: a check under the freeze that cannot finish (a table of the tenant locked
/// on the source) is cut off at `--max-freeze`, and the tenant is released in time while the
/// check's statement is still stuck: the abort does not queue behind it.
#[tokio::test]
async fn a_check_that_overruns_the_freeze_does_not_hold_the_tenant() {
    let t = with_tenant("overrun").await;
    let blocker = t.shard("shard_1").await;
    let frozen_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let lock = act_at(Phase::Frozen, {
        let (blocker, frozen_at) = (std::sync::Arc::new(blocker), frozen_at.clone());
        move || {
            let (blocker, frozen_at) = (blocker.clone(), frozen_at.clone());
            Box::pin(async move {
                blocker
                    .batch_execute("BEGIN; LOCK TABLE order_lines IN ACCESS EXCLUSIVE MODE")
                    .await
                    .unwrap();
                *frozen_at.lock().unwrap() = Some(Instant::now());
            })
        }
    });
    let options = MoveOptions {
        method: MethodChoice::Logical,
        max_freeze: Duration::from_secs(2),
        lease_grace: Duration::from_secs(1),
        online_check: false,
        freeze_attempts: 1,
        ..Default::default()
    };
    let failure = tokio::time::timeout(
        DEADLINE,
        t.mover(options)
            .with_observer(lock)
            .start(&EntityKey::new("tenant", "a"), "shard_2"),
    )
    .await
    .expect("the mover returns while the table is still locked")
    .expect_err("a freeze that overran is undone");
    let took = frozen_at.lock().unwrap().expect("frozen").elapsed();
    assert_eq!(failure.left, Left::Aborted, "{failure}");
    assert!(
        took < Duration::from_secs(5),
        "released {took:?} after the freeze"
    );
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
    assert_eq!(t.fence("shard_1", "a").await, None);
}

/// Issue 41, item 6: a paced copy killed once it committed on the target, resumed without the
/// pace: the subscription's copy starts from a target without those rows, and the move ends
/// with every row once on shard_2.
#[tokio::test]
async fn a_paced_copy_resumed_without_its_pace_starts_from_an_empty_target() {
    let t = with_tenant("paced-resumed").await;
    let args = move_of("logical", &["--max-rate", "1000"]);
    let (code, _, stderr) = cli(&t, &args, "paced.enable_subscription=return(kill)").await;
    assert_eq!(code, None, "killed once its copy committed: {stderr}");
    assert_eq!(t.rows("shard_2", "a").await, (20, 40), "the copy committed");
    let id = open_phase(&t, "a").await.expect("open").0;
    let (code, json, stderr) = cli(&t, &["resume", &id.to_string()], "").await;
    assert_eq!(code, Some(0), "{json} {stderr}");
    assert_eq!(json["phase"].as_str(), Some("done"));
    assert_eq!(t.rows("shard_2", "a").await, (20, 40));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
}

/// Issue 41, item 8: the mover's directory connection is cut by a network blip in the freeze;
/// the server keeps the old session, and the move's lock with it. The mover's resume ends its
/// own old session instead of giving up as busy, and the move finishes.
#[tokio::test]
async fn a_directory_blip_in_the_freeze_is_waited_out_not_reported_busy() {
    let t = with_tenant("blip").await;
    let proxy = Proxy::forwarding(t.directory.port()).await;
    let through = t
        .directory
        .conn_str(DIRECTORY_DB)
        .replace(
            &format!("port={}", t.directory.port()),
            &format!("port={}", proxy.port()),
        )
        .parse()
        .unwrap();
    let reached = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let observer = act_at(Phase::Verified, {
        let (reached, release) = (reached.clone(), release.clone());
        move || {
            let (reached, release) = (reached.clone(), release.clone());
            Box::pin(async move {
                reached.notify_one();
                release.notified().await;
            })
        }
    });
    let options = MoveOptions {
        method: MethodChoice::Copy,
        max_freeze: Duration::from_secs(10),
        ..Default::default()
    };
    let mover = Mover::new(through, Overrides::default(), options).with_observer(observer);
    let key = EntityKey::new("tenant", "a");
    let moving = mover.start(&key, "shard_2");
    let blip = async {
        reached.notified().await;
        proxy.cut();
        release.notify_one();
    };
    let (moved, ()) = tokio::join!(moving, blip);
    let moved = moved.expect("the move goes on after the blip");
    assert_eq!(moved.phase, Phase::Done);
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_2"));
    assert_eq!(t.rows("shard_2", "a").await, (20, 40));
}

/// A read of tenant `a` on `shard`, checked as a client at directory `version` does it: `Ok` with
/// the rows it saw, or the refusal's SQLSTATE and message.
async fn read_at(t: &Topology, shard: &str, version: i64) -> Result<i64, String> {
    let mut c = t.shard(shard).await;
    let tx = c.transaction().await.unwrap();
    let checked = tx
        .batch_execute(&format!(
            "SELECT set_config('app.directory_version', '{version}', true), \
                    set_config('app.entity_type', 'tenant', true), \
                    set_config('app.entity_id', 'a', true); \
             SELECT shard_directory.assert_directory_version(true)"
        ))
        .await;
    match checked {
        Ok(()) => Ok(tx
            .query_one("SELECT count(*) FROM orders WHERE tenant_id = 'a'", &[])
            .await
            .unwrap()
            .get(0)),
        Err(e) => Err(format!(
            "{} {}",
            e.code().map_or("?", |c| c.code()),
            e.as_db_error().map_or("", |d| d.message())
        )),
    }
}

/// Issue 41, item 10: from the moment the target can be written (the cutover commits), the
/// source serves no reader that has not seen the cutover: not while the mover sets the `moved`
/// fence, and not after its lease if the mover dies there. A reader at a version between the
/// freeze and the cutover is refused (and learns the move), never served the source's rows.
#[tokio::test]
async fn no_reader_is_served_by_the_source_once_the_target_may_be_written() {
    let t = with_tenant("cutover-reads").await;
    let (frozen, cut) = (Held::new("cutover-frozen"), Held::new("cutover-cut"));
    let failpoints = format!(
        "{};{}",
        frozen.at("enter.verified"),
        cut.at("fence.FenceSource.source")
    );
    let args = move_of("logical", &["--json"]);
    let mut mover = command(&t)
        .args(args)
        .args(TUNING)
        .env("FAILPOINTS", failpoints)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    frozen.reached().await;
    // Frozen: another change of the directory, so that a reader can be at a version between
    // the freeze's and the cutover's.
    let between = t.add_tenant("b", "shard_1").await;
    assert_eq!(
        read_at(&t, "shard_1", between).await,
        Ok(20),
        "frozen: reads pass"
    );
    frozen.release();
    cut.reached().await;
    let (id, phase) = open_phase(&t, "a").await.unwrap();
    assert_eq!(phase, Phase::Cutover, "the cutover committed");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_2"));
    let refused = read_at(&t, "shard_1", between).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.starts_with("40001")),
        "a reader at {between} is served by the source after the cutover: {refused:?}"
    );
    // The mover dies before the source's `moved` fence: past the lease (2 s), still refused.
    mover.kill().await.unwrap();
    let source = t.shard("shard_1").await;
    eventually("the source fence's lease to end", DEADLINE, || async {
        let ended: bool = source
            .query_one(
                "SELECT coalesce(bool_and(lease_until < clock_timestamp()), true) \
                 FROM shard_directory.shard_fences WHERE entity_id = 'a'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        ended.then_some(())
    })
    .await;
    let refused = read_at(&t, "shard_1", between).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.starts_with("40001")),
        "past the lease, a reader at {between} is served by the source: {refused:?}"
    );
    let (code, json, stderr) = cli(&t, &["resume", &id.to_string()], "").await;
    assert_eq!(code, Some(0), "{json} {stderr}");
    assert_eq!(t.rows("shard_2", "a").await, (20, 40));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));
}

/// A statement on the directory, given `limit` to finish (its commit included, which
/// `statement_timeout` does not bound): how long it took, or why it did not.
async fn directory_statement(t: &Topology, sql: &str, limit: Duration) -> Result<Duration, String> {
    let c = t.dba().await;
    c.batch_execute(&format!("SET statement_timeout = {}", limit.as_millis()))
        .await
        .unwrap();
    let started = Instant::now();
    let sql = sql.to_owned();
    let run = tokio::spawn(async move { c.batch_execute(&sql).await });
    match tokio::time::timeout(limit + Duration::from_secs(1), run).await {
        Ok(Ok(Ok(()))) => Ok(started.elapsed()),
        Ok(Ok(Err(e))) => Err(format!("{e:?} after {:?}", started.elapsed())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("still waiting after {:?}", started.elapsed())),
    }
}

/// Waits until move `id`'s freeze lease has ended on the directory's clock.
async fn past_the_lease(t: &Topology, id: i64) {
    let dba = t.dba().await;
    eventually("the freeze's lease to end", DEADLINE, || async {
        let ended: bool = dba
            .query_one(
                "SELECT freeze_lease_until < clock_timestamp() FROM shard_directory.shard_moves \
                 WHERE move_id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        ended.then_some(())
    })
    .await;
}

/// After its lease, as a router and a DBA find it: tenant `a`'s release, another entity's
/// change of the directory and a write of `a` all go through.
async fn neither_the_directory_nor_the_tenant_is_held(t: &Topology, id: i64) {
    past_the_lease(t, id).await;
    let release = directory_statement(
        t,
        "SELECT shard_directory.release_expired_freeze('tenant', 'a')",
        Duration::from_secs(3),
    )
    .await;
    assert!(
        release.is_ok(),
        "the tenant cannot be released: {release:?}"
    );
    let unrelated = directory_statement(
        t,
        "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) \
         VALUES ('tenant', 'b', 'shard_2')",
        Duration::from_secs(3),
    )
    .await;
    assert!(
        unrelated.is_ok(),
        "other directory writers stalled: {unrelated:?}"
    );
    writes_within(t, Duration::from_secs(10)).await;
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
}

/// Found by the attack on issue 41: the source's cutover fence is set inside the directory
/// transaction that holds the version lock; a source that stops answering there (a network
/// partition: no RST) must hold neither the directory nor the tenant past the lease. The mover
/// reaches shard_1 through a proxy that partitions it; the routers reach it directly.
#[tokio::test]
async fn a_source_partitioned_at_the_cutover_holds_neither_the_directory_nor_the_tenant() {
    let t = with_tenant("cutover-partition").await;
    let source = t.shard_cluster("shard_1");
    let proxy = Proxy::forwarding(source.port()).await;
    let config = t.directory.scratch_path("overrides.toml");
    std::fs::write(
        &config,
        format!(
            "[shards.shard_1]\nconninfo = \"{}\"\nreplication_conninfo = \"{}\"\n",
            proxy.conn_str(source, "app"),
            source.conn_str("app")
        ),
    )
    .unwrap();
    let held = Held::new("cutover-partition");
    let mut args = move_of("logical", &["--fence-wait", "2s", "--config"]);
    let config = config.display().to_string();
    args.push(&config);
    let failpoint = held.at("fence.cutover.source");
    let moving = cli(&t, &args, &failpoint);
    let partition = async {
        held.reached().await;
        let id = open_phase(&t, "a").await.expect("an open move").0;
        proxy.pause(true);
        held.release();
        neither_the_directory_nor_the_tenant_is_held(&t, id).await;
        proxy.pause(false);
    };
    let ((code, json, stderr), ()) = tokio::join!(moving, partition);
    assert!(
        matches!(code, Some(1 | 3)) && t.entry("tenant", "a").await == active_on("shard_1"),
        "{code:?} {json} {stderr}"
    );
}

/// The same with no network fault: a maintenance transaction on the source holds a lock on
/// `shard_fences` that conflicts with writing it (SHARE, as `CREATE INDEX` takes) when the mover
/// sets the cutover fence.
#[tokio::test]
async fn a_lock_on_the_source_fences_at_the_cutover_holds_neither_the_directory_nor_the_tenant() {
    let t = with_tenant("cutover-lock").await;
    let held = Held::new("cutover-lock");
    let args = move_of("logical", &["--fence-wait", "2s"]);
    let failpoint = held.at("fence.cutover.source");
    let moving = cli(&t, &args, &failpoint);
    let maintenance = t.shard("shard_1").await;
    let locked = async {
        held.reached().await;
        let id = open_phase(&t, "a").await.expect("an open move").0;
        maintenance
            .batch_execute("BEGIN; LOCK TABLE shard_directory.shard_fences IN SHARE MODE")
            .await
            .unwrap();
        held.release();
        neither_the_directory_nor_the_tenant_is_held(&t, id).await;
        maintenance.batch_execute("COMMIT").await.unwrap();
    };
    let ((code, json, stderr), ()) = tokio::join!(moving, locked);
    assert!(matches!(code, Some(1 | 3)), "{code:?} {json} {stderr}");
    assert_eq!(t.entry("tenant", "a").await, active_on("shard_1"));
}
