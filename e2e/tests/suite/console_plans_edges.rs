//! Off the usual paths of the console's run of a drawn plan, its live batches and lag, its
//! tenant rows and its HTTPS (written by an attack on them). Each test is named for the
//! invariant it checks.

use std::time::{Duration, Instant};

use shard_directory_e2e::console::{Console, Page};
use shard_directory_e2e::topology::NON_TEXT_KEYS;
use shard_directory_e2e::{eventually, within, Topology};
use shard_directory_mover::{BatchOptions, EntityKey, MoveOptions, Weigh};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::console::{
    catching_up, cell_of, console_with_actions, hidden, phase_of, table_row, TOKEN,
};
use super::console_plans::batch_of;

fn bearer() -> String {
    format!("Authorization: Bearer {TOKEN}")
}

/// Move rows in the directory.
async fn moves(t: &Topology) -> i64 {
    t.dba()
        .await
        .query_one("SELECT count(*) FROM shard_directory.shard_moves", &[])
        .await
        .unwrap()
        .get(0)
}

/// The plan drawn for `query` on the fleet page: its form's csrf, digest and single-use token.
async fn drawn(console: &Console, query: &str) -> (String, String, String) {
    let page = console.get_with(&format!("/{query}"), &[&bearer()]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("form class=\"run\""), "{}", page.body);
    let field = |name| hidden(&page.body, name);
    (field("csrf"), field("digest"), field("once"))
}

async fn run(console: &Console, query: &str, body: &str) -> Page {
    console
        .post(&format!("/plans/run{query}"), &[&bearer()], body)
        .await
}

/// The "run plan" records of the audit log.
fn run_records(audit: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["action"] == "run plan")
        .collect()
}

/// The head of the answer to `GET path` (plain HTTP), or why there was none within `deadline`.
async fn head_of(
    addr: &str,
    path: &str,
    headers: &[&str],
    deadline: Duration,
) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{extra}\r\n");
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let read = tokio::time::timeout(deadline, async {
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok::<_, String>(());
            }
            got.extend_from_slice(&buf[..n]);
            if got.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(());
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got).to_string();
    match read {
        Ok(Ok(())) if !text.is_empty() => Ok(text),
        Ok(Ok(())) => Err("closed without an answer".into()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no head within {deadline:?}: {text:?}")),
    }
}

fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sessions on `db` of `cluster` whose application_name is `name`.
async fn sessions(cluster: &shard_directory_e2e::Cluster, name: &str) -> i64 {
    cluster
        .connect("postgres")
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

// ---------------------------------------------------------------------------------------------
// What is run is what was confirmed; what is recorded is what happened.

/// A run whose move failed (the target refuses the tenant's rows) must not be recorded `done`
/// in the audit log, as `drain --apply` exits non-zero for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_failed_move_is_not_recorded_done() {
    let t = Topology::start("attack-run-failed").await;
    for id in ["f1", "f2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 20, 1).await;
    }
    // shard_2 takes no row of f1.
    t.shard("shard_2")
        .await
        .batch_execute("ALTER TABLE orders ADD CONSTRAINT no_f1 CHECK (tenant_id <> 'f1')")
        .await
        .unwrap();
    let (console, audit) = console_with_actions(&t).await;
    let query = "?by=rows&plan=drain&shard=shard_1";
    let (csrf, digest, once) = drawn(&console, query).await;
    let ran = run(
        &console,
        query,
        &format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes"),
    )
    .await;
    assert_eq!(ran.status, 303, "{}", ran.body);
    let batch_id = batch_of(&ran);
    let ended = eventually("the run's end recorded", Duration::from_secs(120), || {
        let audit = audit.clone();
        async move {
            let records = run_records(&audit);
            (records.len() >= 3).then_some(records)
        }
    })
    .await;
    // What happened: f1 did not move.
    assert_eq!(
        t.entry("tenant", "f1").await.0,
        "shard_1",
        "f1 could not move"
    );
    let failed_moves: i64 = t
        .dba()
        .await
        .query_one(
            "SELECT count(*) FROM shard_directory.shard_moves \
             WHERE batch_id = $1 AND phase <> 'done'",
            &[&batch_id],
        )
        .await
        .unwrap()
        .get(0);
    let phases: String = t
        .dba()
        .await
        .query_one(
            "SELECT coalesce(string_agg(entity_id || ' ' || phase, ', '), '') \
             FROM shard_directory.shard_moves WHERE batch_id = $1",
            &[&batch_id],
        )
        .await
        .unwrap()
        .get(0);
    let outcome = ended[2]["outcome"].as_str().unwrap_or_default().to_owned();
    assert_ne!(
        outcome, "done",
        "batch {batch_id}: f1's move failed ({failed_moves} moves not done, f1 still on \
         shard_1; moves: {phases}), yet the audit log records the run `done`: {ended:#?}"
    );
}

/// The same form sent twice (a double click, a replay) runs the plan once: the second POST,
/// while the first batch runs, must not record a second batch of the same moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_run_form_does_not_start_a_second_batch() {
    let t = Topology::start("attack-run-replay").await;
    for id in ["r1", "r2", "r3"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 2000, 1).await;
    }
    let (console, _audit) = console_with_actions(&t).await;
    let query = "?by=rows&plan=drain&shard=shard_1";
    let (csrf, digest, once) = drawn(&console, query).await;
    let body =
        format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes&parallel=1&per_shard=1");
    let first = run(&console, query, &body).await;
    assert_eq!(first.status, 303, "{}", first.body);
    let first_id = batch_of(&first);
    let second = run(&console, query, &body).await;
    let recorded = t.batches().await;
    let state: String = t
        .dba()
        .await
        .query_one(
            "SELECT state FROM shard_directory.shard_move_batches WHERE batch_id = $1",
            &[&first_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        recorded,
        1,
        "the form sent again while batch {first_id} is {state} was answered {} ({}) and \
         recorded a second batch of the same moves",
        second.status,
        second
            .headers
            .lines()
            .find(|l| l.starts_with("location"))
            .unwrap_or_default()
    );
    assert_ne!(second.status, 303, "{}", second.headers);
}

/// `parallel` past what the batch's row holds is odd input: refused as such (4xx), no batch, and
/// never run with another number than the one confirmed. Negative and non-numeric: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_parallel_is_refused_as_bad_input_and_never_run_as_another() {
    let t = Topology::start("attack-run-parallel").await;
    t.add_tenant("o1", "shard_1").await;
    t.seed_orders("shard_1", "o1", 10, 1).await;
    let (console, _audit) = console_with_actions(&t).await;
    let query = "?by=rows&plan=drain&shard=shard_1";
    let (csrf, digest, once) = drawn(&console, query).await;
    let mut wrong = Vec::new();
    for parallel in ["-1", "abc", "1e3", "2147483648", "4294967297"] {
        let before = t.batches().await;
        let page = run(
            &console,
            query,
            &format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes&parallel={parallel}"),
        )
        .await;
        let after = t.batches().await;
        let stored: Option<i32> = t
            .dba()
            .await
            .query_opt(
                "SELECT parallel FROM shard_directory.shard_move_batches \
                 ORDER BY batch_id DESC LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get(0));
        let refused = (400..500).contains(&page.status) && after == before;
        if !refused {
            wrong.push(format!(
                "parallel={parallel}: answered {}, batches {before} -> {after} (last stored \
                 parallel {stored:?}): {}",
                page.status,
                page.body.chars().take(300).collect::<String>()
            ));
        }
        if after > before {
            // Let it end before the next try, so that the plan is drawn the same.
            break;
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Refusals of a run leave nothing: GET, no query, another plan's query, another user's CSRF,
/// a form of no plan; none a 5xx; no batch row, no move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_runs_leave_no_batch_and_no_move_and_no_5xx() {
    let t = Topology::start("attack-run-refused").await;
    for (id, shard) in [("x1", "shard_1"), ("x2", "shard_2")] {
        t.add_tenant(id, shard).await;
        t.seed_orders(shard, id, 10, 1).await;
    }
    // Two users: alice and bob.
    let users = t.directory.scratch_path("console-users-2");
    let bob = "bob-fedcba9876543210";
    std::fs::write(&users, format!("alice:{TOKEN}\nbob:{bob}\n")).unwrap();
    let console = Console::start(
        &t,
        "",
        &["--allow-actions", "--token-file", users.to_str().unwrap()],
    )
    .await;
    let query = "?by=rows&plan=drain&shard=shard_1";
    let (csrf, digest, once) = drawn(&console, query).await;
    let ok = format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes");
    let bob_bearer = format!("Authorization: Bearer {bob}");
    let mut answers = Vec::new();
    // Not a run: GET.
    let get = console
        .get_with(&format!("/plans/run{query}"), &[&bearer()])
        .await;
    answers.push(("GET", get.status));
    // No query at all.
    answers.push(("no query", run(&console, "", &ok).await.status));
    // Another plan's query with this digest.
    answers.push((
        "drain shard_2",
        run(&console, "?by=rows&plan=drain&shard=shard_2", &ok)
            .await
            .status,
    ));
    answers.push((
        "rebalance",
        run(&console, "?by=rows&plan=rebalance&tolerance=0", &ok)
            .await
            .status,
    ));
    answers.push((
        "split to shard_2",
        run(
            &console,
            "?by=rows&plan=split&shard=shard_1&to=shard_2&fraction=0.01",
            &ok,
        )
        .await
        .status,
    ));
    answers.push((
        "unknown plan",
        run(&console, "?plan=merge&shard=shard_1", &ok).await.status,
    ));
    answers.push((
        "by=weight",
        run(&console, "?by=weight&plan=drain&shard=shard_1", &ok)
            .await
            .status,
    ));
    // Bob sends alice's form.
    let bobs = console
        .post(&format!("/plans/run{query}"), &[&bob_bearer], &ok)
        .await;
    answers.push(("bob with alice's csrf", bobs.status));
    // Missing fields.
    answers.push((
        "no digest",
        run(&console, query, &format!("csrf={csrf}&confirm=yes"))
            .await
            .status,
    ));
    answers.push((
        "no csrf",
        run(&console, query, &format!("digest={digest}&confirm=yes"))
            .await
            .status,
    ));
    answers.push(("empty body", run(&console, query, "").await.status));
    answers.push((
        "confirm=no",
        run(
            &console,
            query,
            &format!("csrf={csrf}&once={once}&digest={digest}&confirm=no"),
        )
        .await
        .status,
    ));
    let bad: Vec<_> = answers
        .iter()
        .filter(|(_, s)| !(400..500).contains(s))
        .collect();
    assert!(
        bad.is_empty(),
        "not refused as 4xx: {bad:?} (all: {answers:?})"
    );
    assert_eq!(t.batches().await, 0, "{answers:?}");
    assert_eq!(moves(&t).await, 0, "{answers:?}");
}

/// The page of a batch that does not exist (as a mistyped or stale link, or a redirect of a run
/// to a batch since removed) is a 404, as an unknown move's is, not a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_of_an_unknown_batch_is_a_404_not_a_5xx() {
    let t = Topology::start("attack-batch-unknown").await;
    let (console, _audit) = console_with_actions(&t).await;
    let b = bearer();
    let unknown_move = console.get_with("/moves/999999", &[&b]).await;
    let unknown_batch = console.get_with("/batches/999999", &[&b]).await;
    let abc = console.get_with("/batches/abc", &[&b]).await;
    assert!((400..500).contains(&abc.status), "{}", abc.status);
    assert_eq!(
        unknown_batch.status, 404,
        "an unknown move is {}, an unknown batch {}: {}",
        unknown_move.status, unknown_batch.status, unknown_batch.body
    );
}

// ---------------------------------------------------------------------------------------------
// The live page tells the truth.

/// A batch paused, then aborted (by the console's own action, no move open): its live page
/// reaches `aborted`, as the directory says, and does not stall at `paused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_aborted_while_paused_reaches_aborted_on_its_live_page() {
    let t = Topology::start("attack-batch-abort").await;
    for id in ["q1", "q2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 10, 1).await;
    }
    // A batch recorded (as `drain --out` then `move --from-file` would), not run, then paused;
    // the console started then (its first read has the paused batch).
    let mover = t.mover(MoveOptions::default());
    let fleet = mover.fleet(false).await.unwrap();
    let plan = shard_directory_mover::drain(&fleet, "shard_1", &[], Weigh::Rows).unwrap();
    let options = BatchOptions {
        parallel: 1,
        per_shard: 1,
    };
    let batch_id = mover.record_batch(&plan, options).await.unwrap();
    mover.pause_batch(batch_id).await.unwrap();
    let (console, _audit) = console_with_actions(&t).await;
    let mut events = console
        .watch_with(&format!("/batches/{batch_id}/events"), &[&bearer()])
        .await;
    events
        .until(Duration::from_secs(30), |d| {
            d.contains("data-state=\"paused\"")
        })
        .await;
    // Aborted from the console.
    let confirm = console
        .get_with(&format!("/batches/{batch_id}/abort"), &[&bearer()])
        .await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    let csrf = hidden(&confirm.body, "csrf");
    let aborted = console
        .post(
            &format!("/batches/{batch_id}/abort"),
            &[&bearer()],
            &format!("csrf={csrf}&confirm=yes"),
        )
        .await;
    assert!(aborted.status < 400, "{}", aborted.body);
    eventually("the batch aborted", Duration::from_secs(30), || async {
        let state: String = t
            .dba()
            .await
            .query_one(
                "SELECT state FROM shard_directory.shard_move_batches WHERE batch_id = $1",
                &[&batch_id],
            )
            .await
            .unwrap()
            .get(0);
        (state == "aborted").then_some(())
    })
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = Vec::new();
        while let Some((_, d)) = events.next().await {
            let found = d.contains("data-state=\"aborted\"");
            seen.push(d);
            if found {
                return (true, seen);
            }
        }
        (false, seen)
    })
    .await;
    let page = console
        .get_with(&format!("/batches/{batch_id}"), &[&bearer()])
        .await;
    assert!(
        matches!(seen, Ok((true, _))),
        "batch {batch_id} is aborted in the directory, but its live section never said so \
         within 20 s (it stays paused); the page reloaded says aborted: {}",
        page.body.contains("data-state=\"aborted\"")
    );
}

/// Odd batch ids on the live route: a 4xx or a stream, never a 5xx, and an answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_batch_event_routes_answer_at_once_without_5xx() {
    let t = Topology::start("attack-batch-odd").await;
    let (console, _audit) = console_with_actions(&t).await;
    let b = bearer();
    let mut bad = Vec::new();
    for path in [
        "/batches/abc/events",
        "/batches/999999/events",
        "/batches/-1/events",
        "/batches/99999999999999999999/events",
    ] {
        match head_of(&console.addr, path, &[&b], Duration::from_secs(5)).await {
            Ok(head) if status_of(&head) < 500 && status_of(&head) >= 200 => {}
            other => bad.push(format!("{path}: {other:?}")),
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Slot sessions are on the source shard only while a logical move is open there: one however
/// many watch, none once it ends; the directory still sees the console's one session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_sessions_are_one_per_shard_for_many_watchers_and_end_with_the_move() {
    let t = Topology::start("attack-slot-sessions").await;
    let move_id = catching_up(&t, "s1").await;
    let console = Console::start(&t, "", &[]).await;
    let mut watchers = Vec::new();
    for _ in 0..30 {
        watchers.push(console.watch().await);
    }
    watchers[0]
        .until(Duration::from_secs(30), |d| {
            cell_of(d, move_id, "n lag").is_some_and(|c| c.ends_with('B'))
        })
        .await;
    let shard_1 = t.shard_cluster("shard_1");
    let shard_2 = t.shard_cluster("shard_2");
    // The killed mover's sessions go; the console keeps one on the source.
    let on_source = eventually(
        "one slot session on shard_1",
        Duration::from_secs(15),
        || async {
            let n = sessions(shard_1, "shard-directory").await;
            (n == 1).then_some(n)
        },
    )
    .await;
    assert_eq!(on_source, 1);
    assert_eq!(
        sessions(shard_2, "shard-directory").await,
        0,
        "none on the target"
    );
    assert_eq!(sessions(&t.directory, "shard-directory console").await, 1);
    // The move aborted: the source's session goes.
    t.mover(MoveOptions::default())
        .abort(move_id)
        .await
        .unwrap();
    watchers[1]
        .until(Duration::from_secs(30), |d| {
            phase_of(d, move_id).as_deref() == Some("aborted")
        })
        .await;
    eventually(
        "no console session left on shard_1 once the move ended",
        Duration::from_secs(15),
        || async { (sessions(shard_1, "shard-directory").await == 0).then_some(()) },
    )
    .await;
    assert_eq!(sessions(&t.directory, "shard-directory console").await, 1);
}

/// A frozen source shard (SIGSTOP) costs the live list at most its 3 s bound per try, every 10 s:
/// another move, on other shards, walks to `done` on the list with no gap between reads longer
/// than that; once thawed, no session of the console's is left behind on it beyond the one kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_shard_does_not_stall_the_live_list_nor_leak_sessions() {
    let t = Topology::with_shards("attack-frozen", 3).await;
    t.add_tenant("z3", "shard_3").await;
    t.seed_orders("shard_3", "z3", 3000, 2).await;
    let stuck = catching_up(&t, "z1").await;
    let console = Console::start(&t, "", &[]).await;
    let mut events = console.watch().await;
    events
        .until(Duration::from_secs(30), |d| {
            cell_of(d, stuck, "n lag").is_some_and(|c| c.ends_with('B'))
        })
        .await;
    let shard_1 = t.shard_cluster("shard_1");
    let frozen = shard_1.freeze();
    // A move elsewhere, watched to its end while shard_1 is frozen.
    let mover = t.mover(MoveOptions::default());
    let moving = async {
        mover
            .start(&EntityKey::new("tenant", "z3"), "shard_2")
            .await
            .map(|m| m.move_id)
            .map_err(|e| e.to_string())
    };
    let started = Instant::now();
    let watching = async {
        let mut last = Instant::now();
        let mut gaps = Vec::new();
        let reached = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some((_, d)) = events.next().await {
                gaps.push(last.elapsed());
                last = Instant::now();
                if d.contains("data-phase=\"done\"") && d.contains("z3") {
                    return true;
                }
            }
            false
        })
        .await;
        (reached, gaps)
    };
    let (moved, (reached, gaps)) = tokio::join!(moving, watching);
    assert!(
        matches!(reached, Ok(true)),
        "z3's move {moved:?} never shown done"
    );
    // The first read after the freeze may wait out one bound; none waits longer than
    // 1 s tick + 3 s bound (and some slack).
    let longest = gaps.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= Duration::from_secs(6),
        "a gap of {longest:?} between reads of the live list while shard_1 was frozen \
         ({:?} in all): {gaps:?}",
        started.elapsed()
    );
    drop(frozen);
    // Thawed: the sessions the console opened (and gave up) on shard_1 go; at most the one kept.
    let left = within(Duration::from_secs(20), || async {
        let n = sessions(shard_1, "shard-directory").await;
        (n <= 1).then_some(n)
    })
    .await;
    assert!(
        left.is_some(),
        "console sessions left on shard_1 after the thaw: {}",
        sessions(shard_1, "shard-directory").await
    );
}

// ---------------------------------------------------------------------------------------------
// The tenant page counts only that tenant's rows, and never fails on an odd id.

/// An id that is not canonical for its bigint (or uuid) key names another entity than the
/// canonical one: its page must not count the canonical entity's rows as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_page_of_a_non_canonical_id_does_not_count_another_entitys_rows() {
    let t = Topology::start("attack-tenant-canonical").await;
    t.on_every_shard(NON_TEXT_KEYS).await;
    let lower = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
    let upper = "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11";
    for (kind, id) in [
        ("account", "8842"),
        ("account", "08842"),
        ("device", lower),
        ("device", upper),
    ] {
        t.add_entity(kind, id, "shard_1").await;
    }
    t.write_as_client("shard_1", "INSERT INTO accounts VALUES (8842, 'x')")
        .await
        .unwrap();
    t.write_as_client(
        "shard_1",
        &format!("INSERT INTO devices VALUES ('{lower}')"),
    )
    .await
    .unwrap();
    let console = Console::start(&t, "", &[]).await;
    let canonical = console.get("/tenants/account/8842").await;
    assert_eq!(
        table_row(&canonical.body, "public.accounts").map(|r| r.0),
        Some(1),
        "{}",
        canonical.body
    );
    let mut wrong = Vec::new();
    for (path, table) in [
        ("/tenants/account/08842", "public.accounts"),
        (&*format!("/tenants/device/{upper}"), "public.devices"),
    ] {
        let page = console.get(path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        if let Some((rows, _)) = table_row(&page.body, table) {
            if rows != 0 {
                wrong.push(format!(
                    "{path}: {rows} row(s) of {table} counted as its own, the canonical \
                     entity's"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Odd ids on the tenant page, with and without an entry: a page or a 4xx, never a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_page_of_an_odd_id_is_never_a_5xx() {
    let t = Topology::start("attack-tenant-odd").await;
    t.on_every_shard(
        "CREATE TABLE accounts (account_id bigint PRIMARY KEY, name text);
         SELECT shard_directory.protect('accounts', 'account_id', 'account');",
    )
    .await;
    for id in ["eighty", "99999999999999999999999", " 1", "1.0"] {
        t.add_entity("account", id, "shard_1").await;
    }
    t.add_entity("tenant", "o'brien\"<b>", "shard_1").await;
    let console = Console::start(&t, "", &[]).await;
    let long = "x".repeat(5000);
    let mut bad = Vec::new();
    for path in [
        "/tenants/account/eighty".to_owned(),
        "/tenants/account/99999999999999999999999".to_owned(),
        "/tenants/account/%201".to_owned(),
        "/tenants/account/1.0".to_owned(),
        "/tenants/account/%00".to_owned(),
        "/tenants/tenant/o'brien%22%3Cb%3E".to_owned(),
        "/tenants/nosuchtype/1".to_owned(),
        format!("/tenants/tenant/{long}"),
        "/tenants/tenant/%F0%9F%98%80".to_owned(),
        "/tenants/tenant/%FF".to_owned(),
    ] {
        let page = console.get(&path).await;
        if page.status >= 500 {
            bad.push(format!(
                "{}: {} {}",
                &path[..path.len().min(60)],
                page.status,
                page.body.chars().take(300).collect::<String>()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// A tenant whose rows cannot be counted in time (its table locked on its shard) is cut at the
/// count's 10 s bound: the page answers, well within its own 20 s, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_page_whose_count_is_blocked_is_cut_at_its_bound() {
    let t = Topology::start("attack-tenant-slow").await;
    t.add_tenant("h1", "shard_1").await;
    t.seed_orders("shard_1", "h1", 50, 1).await;
    let console = Console::start(&t, "", &[]).await;
    let locker = t.shard("shard_1").await;
    locker
        .batch_execute("BEGIN; LOCK TABLE order_lines IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let asked = Instant::now();
    let page = console.get("/tenants/tenant/h1").await;
    let took = asked.elapsed();
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("could not be counted") && page.body.contains("History"),
        "{}",
        page.body
    );
    assert!(took < Duration::from_secs(15), "the page took {took:?}");
}

// ---------------------------------------------------------------------------------------------
// HTTPS.

/// Over HTTPS, two hundred clients that connect and never finish a handshake (some sending half
/// a ClientHello) hold up no other: a page is served at once; plain HTTP gets no page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_handshaking_tls_clients_hold_up_no_one() {
    let t = Topology::start("attack-tls-silent").await;
    let (cert, key) = (
        t.directory.scratch_path("console.crt"),
        t.directory.scratch_path("console.key"),
    );
    let pem = super::console_tls::certificate(&cert, &key);
    let console = Console::start(
        &t,
        "",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    )
    .await
    .over_tls(&pem);
    let mut held = Vec::new();
    for i in 0..200 {
        let mut s = tokio::net::TcpStream::connect(&console.addr).await.unwrap();
        if i % 2 == 0 {
            // A TLS record header announcing a handshake, and a few bytes of it.
            s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
                .await
                .unwrap();
        }
        held.push(s);
    }
    let asked = Instant::now();
    let page = tokio::time::timeout(Duration::from_secs(5), console.get("/moves")).await;
    let took = asked.elapsed();
    assert!(
        matches!(&page, Ok(p) if p.status == 200),
        "a page over TLS with 200 silent clients: {took:?}"
    );
    let plain = head_of(&console.addr, "/moves", &[], Duration::from_secs(15)).await;
    assert!(
        !plain.as_deref().unwrap_or_default().contains("HTTP/1."),
        "plain HTTP served: {plain:?}"
    );
    drop(held);
}
