//! The console runs a plan it drew (`--allow-actions`): only the plan drawn, confirmed, from its
//! own form, recorded; the batch's page follows it live. In a real browser: a drain run from the
//! fleet page while the application writes, watched to its end without reloading.

use std::time::Duration;

use shard_directory_e2e::console::{Console, Page};
use shard_directory_e2e::Topology;

use super::console::{console_with_actions, hidden, Browser, TOKEN};

/// The batch a run answered with (its `Location`), by id.
pub(crate) fn batch_of(page: &Page) -> i64 {
    let location = page
        .headers
        .lines()
        .find_map(|l| l.strip_prefix("location: "))
        .unwrap_or_else(|| panic!("a Location: {}", page.headers));
    location
        .rsplit('/')
        .next()
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("a batch's page: {location}"))
}

/// Waits (2 min at most) for batch `batch_id`'s stream to say it is done.
async fn ran_to_the_end(console: &Console, batch_id: i64, bearer: &str) {
    console
        .watch_with(&format!("/batches/{batch_id}/events"), &[bearer])
        .await
        .until(Duration::from_secs(120), |d| {
            d.contains("data-state=\"done\"")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drawn_plan_runs_only_as_drawn_confirmed_and_from_the_consoles_form() {
    let t = Topology::start("console-plan").await;
    for id in ["p1", "p2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 50, 1).await;
    }
    let (console, audit) = console_with_actions(&t).await;
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let query = "?by=rows&plan=drain&shard=shard_1";
    let drawn = console.get_with(&format!("/{query}"), &[&bearer]).await;
    assert_eq!(drawn.status, 200, "{}", drawn.body);
    assert!(drawn.body.contains("form class=\"run\""), "{}", drawn.body);
    let (csrf, digest) = (hidden(&drawn.body, "csrf"), hidden(&drawn.body, "digest"));
    let once = hidden(&drawn.body, "once");
    let run = |headers: Vec<String>, body: String| {
        let console = &console;
        async move {
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            console
                .post(&format!("/plans/run{query}"), &headers, &body)
                .await
        }
    };
    // Refused, each leaving no batch: no token; another's form; not confirmed; a form from
    // another site; more at once than a batch holds; another plan (which uses the form up);
    // the form used up.
    let form = format!("csrf={csrf}&once={once}&digest={digest}");
    let refusals = [
        (vec![], format!("{form}&confirm=yes"), 401),
        (
            vec![bearer.clone()],
            format!("csrf=00&once={once}&digest={digest}&confirm=yes"),
            403,
        ),
        (vec![bearer.clone()], form.clone(), 400),
        (
            vec![bearer.clone(), "Origin: http://elsewhere.example".into()],
            format!("{form}&confirm=yes"),
            403,
        ),
        (
            vec![bearer.clone()],
            format!("{form}&confirm=yes&parallel=4294967297"),
            400,
        ),
        (
            vec![bearer.clone()],
            format!(
                "csrf={csrf}&once={once}&digest={}&confirm=yes",
                "0".repeat(64)
            ),
            409,
        ),
        (vec![bearer.clone()], format!("{form}&confirm=yes"), 409),
    ];
    for (headers, body, status) in refusals {
        let page = run(headers, body.clone()).await;
        assert_eq!(page.status, status, "{body}: {}", page.body);
    }
    assert_eq!(t.batches().await, 0, "nothing recorded");
    // No run served on a GET.
    let get = console
        .get_with(&format!("/plans/run{query}"), &[&bearer])
        .await;
    assert_eq!(get.status, 405);

    // Drawn again: a fresh form.
    let drawn = console.get_with(&format!("/{query}"), &[&bearer]).await;
    let once = hidden(&drawn.body, "once");
    let form =
        format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes&parallel=2&per_shard=2");
    let ran = run(vec![bearer.clone()], form.clone()).await;
    assert_eq!(ran.status, 303, "{}", ran.body);
    let batch_id = batch_of(&ran);
    // The same form sent again (a double click, a replay) runs nothing more.
    let again = run(vec![bearer.clone()], form).await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(t.batches().await, 1, "one run of one form");
    ran_to_the_end(&console, batch_id, &bearer).await;
    for id in ["p1", "p2"] {
        assert_eq!(t.entry("tenant", id).await.0, "shard_2");
        assert_eq!(t.rows("shard_2", id).await, (50, 50));
        assert_eq!(t.rows("shard_1", id).await, (0, 0));
    }
    let (parallel, per_shard): (i32, i32) = {
        let row = t
            .dba()
            .await
            .query_one(
                "SELECT parallel, per_shard FROM shard_directory.shard_move_batches \
                 WHERE batch_id = $1",
                &[&batch_id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((parallel, per_shard), (2, 2), "run as asked");
    // Recorded: asked, started as the batch, done.
    let recorded = shard_directory_e2e::eventually(
        "the run recorded done",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(&audit).ok()?;
            log.lines()
                .any(|l| l.contains("\"outcome\":\"done\"") && l.contains("run plan"))
                .then_some(log)
        },
    )
    .await;
    let lines: Vec<serde_json::Value> = recorded
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["action"] == "run plan")
        .collect();
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["asked", "started", "done"], "{lines:?}");
    assert!(lines.iter().all(|r| r["user"] == "alice"));
    assert!(
        lines[2]["target"]
            .as_str()
            .unwrap()
            .starts_with(&format!("batch {batch_id} (drain shard_1")),
        "{lines:?}"
    );
    // The shard now empty: the same drain moves nothing, and is not run.
    let again = console.get_with(&format!("/{query}"), &[&bearer]).await;
    assert!(!again.body.contains("form class=\"run\""), "{}", again.body);
    let empty = run(
        vec![bearer.clone()],
        format!("csrf={csrf}&once={once}&digest={digest}&confirm=yes"),
    )
    .await;
    assert!(
        empty.status == 400 || empty.status == 409,
        "{}",
        empty.status
    );
    assert_eq!(t.batches().await, 1);
}

/// The console run as the mover's least-privileged role: its directory session and its shard
/// sessions (`--config`) as role `mover`, holding exactly the grants docs/operations.md lists
/// for the mover, read from the docs. A drain drawn on its fleet page and run from it moves
/// every tenant with its rows (by copy: the role may not subscribe), and the batch is the role's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_runs_from_the_console_as_the_movers_documented_role() {
    // Each shard logs who connects: the moves' sessions there are the role's.
    let logged = [("log_connections", "on")];
    let t = Topology::configured("console-plan-role", &[&logged, &logged]).await;
    for id in ["q1", "q2"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 40, 2).await;
    }
    t.create_mover_role().await;
    t.grant_mover_as_readme_lists(
        "public.orders, public.order_lines",
        "public.orders_order_id_seq",
    )
    .await;
    let config = t.directory.scratch_path("console-as-mover.toml");
    let shards: String = t
        .overrides_as_role(None)
        .shards
        .iter()
        .map(|(name, o)| {
            format!(
                "[shards.{name}]\nconninfo = \"{}\"\n",
                o.conninfo.as_deref().unwrap()
            )
        })
        .collect();
    std::fs::write(&config, shards).unwrap();
    let users = t.directory.scratch_path("console-users");
    std::fs::write(&users, format!("alice:{TOKEN}\n")).unwrap();
    let as_mover = format!("{} user=mover", t.directory.conn_str("directory"));
    let console = Console::start(
        &t,
        "",
        &[
            "--directory",
            &as_mover,
            "--config",
            config.to_str().unwrap(),
            "--allow-actions",
            "--token-file",
            users.to_str().unwrap(),
        ],
    )
    .await;
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let query = "?by=rows&plan=drain&shard=shard_1";
    let drawn = console.get_with(&format!("/{query}"), &[&bearer]).await;
    assert_eq!(drawn.status, 200, "{}", drawn.body);
    assert!(drawn.body.contains("form class=\"run\""), "{}", drawn.body);
    let form = format!(
        "csrf={}&once={}&digest={}&confirm=yes",
        hidden(&drawn.body, "csrf"),
        hidden(&drawn.body, "once"),
        hidden(&drawn.body, "digest")
    );
    let ran = console
        .post(&format!("/plans/run{query}"), &[&bearer], &form)
        .await;
    assert_eq!(ran.status, 303, "{}", ran.body);
    let batch_id = batch_of(&ran);
    ran_to_the_end(&console, batch_id, &bearer).await;
    for id in ["q1", "q2"] {
        assert_eq!(t.entry("tenant", id).await.0, "shard_2");
        assert_eq!(t.rows("shard_2", id).await, (40, 80));
        assert_eq!(t.rows("shard_1", id).await, (0, 0));
    }
    let started_by: String = t
        .dba()
        .await
        .query_one(
            "SELECT started_by FROM shard_directory.shard_move_batches WHERE batch_id = $1",
            &[&batch_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(started_by, "mover");
    for shard in ["shard_1", "shard_2"] {
        let log = t.shard_cluster(shard).server_log();
        assert!(
            log.contains("connection authorized: user=mover database=app"),
            "{shard}: no session as the role"
        );
    }
    // Every page still answers as the role.
    for path in [
        "/",
        "/moves",
        &format!("/batches/{batch_id}"),
        "/tenants/tenant/q1",
    ] {
        let page = console.get_with(path, &[&bearer]).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
    }
}

/// In a real browser: signed in, a drain of shard_1 drawn on the fleet page and run from it,
/// while the application keeps writing to one of its tenants. The batch's page, loaded once,
/// follows it to `done`; every order the application was told was written is on shard_2 once,
/// and none is left on shard_1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_runs_a_drain_under_a_writer_and_watches_its_batch_to_the_end() {
    use fantoccini::Locator;

    let t = Topology::start("console-browser-drain").await;
    for (id, orders) in [("d1", 1500), ("d2", 400)] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, orders, 1).await;
    }
    let (console, _audit) = console_with_actions(&t).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    let home = format!("http://{}/", console.addr);
    c.goto(&home).await.unwrap();
    browser.sign_in(TOKEN).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = async { t.keep_ordering_acked("d1", stopped).await };
    let driven = async {
        let drain = "form:has(input[value='drain'])";
        browser
            .click(&format!("{drain} option[value='shard_1']"))
            .await;
        browser.click(&format!("{drain} button")).await;
        c.wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("form.run"))
            .await
            .expect("the drain drawn, with its run");
        browser.click("form.run input[name='confirm']").await;
        browser.click("form.run button.action").await;
        c.wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("#batch[data-updated]"))
            .await
            .expect("the batch's page, hearing its events");
        c.execute("window.kept = 'mark'; return null", vec![])
            .await
            .unwrap();
        c.wait()
            .at_most(Duration::from_secs(180))
            .for_element(Locator::Css("#batch dl[data-state='done']"))
            .await
            .expect("the batch done on its page");
        browser.screenshot("batch").await;
        stop.send(true).unwrap();
    };
    let (acked, ()) = tokio::join!(writer, driven);
    let kept = c.execute("return window.kept", vec![]).await.unwrap();
    assert_eq!(kept, serde_json::json!("mark"), "the page was not reloaded");
    let phases = c
        .find_all(Locator::Css("#batch tr[data-phase='done']"))
        .await
        .unwrap();
    assert_eq!(phases.len(), 2, "both moves done on the page");
    assert!(!acked.is_empty(), "the application wrote during the drain");
    for id in ["d1", "d2"] {
        assert_eq!(t.entry("tenant", id).await.0, "shard_2");
        assert_eq!(t.rows("shard_1", id).await, (0, 0));
    }
    let mut on_target: Vec<String> = t
        .orders("shard_2", "d1")
        .await
        .into_iter()
        .filter(|item| item.starts_with("live "))
        .collect();
    let mut acked = acked;
    on_target.sort();
    acked.sort();
    assert_eq!(
        on_target, acked,
        "every acked order once on shard_2, no other"
    );
    assert_eq!(t.rows("shard_2", "d2").await, (400, 400));
    browser.client.clone().close().await.unwrap();
}
