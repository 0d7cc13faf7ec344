//! `shard-directory console`: the fleet, a tenant and the moves, read over HTTP as a browser
//! reads them, behind a base path; a move walking through its phases on the live list while a
//! writer writes; a hundred watchers costing the directory one session.

use std::time::Duration;

use shard_directory_e2e::console::Console;
use shard_directory_e2e::prometheus::sample;
use shard_directory_e2e::Topology;
use shard_directory_mover::{EntityKey, MoveOptions, Phase};

/// The phase of move `id` in a moves list, if it is there.
pub(crate) fn phase_of(html: &str, id: i64) -> Option<String> {
    let marker = format!("data-move=\"{id}\" data-phase=\"");
    let at = html.find(&marker)? + marker.len();
    Some(html[at..].split('"').next()?.to_owned())
}

/// Moves `id` to shard_2 (logical) with `options`, through the library the CLI uses; the move's
/// id.
pub(crate) async fn move_to_shard_2(t: &Topology, id: &str, options: MoveOptions) -> i64 {
    let done = t
        .mover(options)
        .start(&EntityKey::new("tenant", id), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("move {id}: {e}"));
    done.move_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_fleet_a_tenant_and_a_move_walking_through_its_phases_live() {
    let t = Topology::start("console").await;
    t.add_tenant("c1", "shard_1").await;
    t.add_tenant("c2", "shard_2").await;
    t.seed_orders("shard_1", "c1", 500, 2).await;
    let console = Console::start(&t, "/console", &[]).await;

    let fleet = console.get("/").await;
    assert_eq!(fleet.status, 200, "{}", fleet.body);
    assert!(
        fleet
            .body
            .contains("<td>shard_1</td><td></td><td class=\"n\">1</td><td class=\"n\">1500</td>"),
        "{}",
        fleet.body
    );
    assert!(
        fleet.body.contains("href=\"/console/moves\""),
        "links under the base path"
    );
    let by_rows = console.get("/?by=rows").await;
    assert!(by_rows.body.contains("balance by rows"), "{}", by_rows.body);
    assert_eq!(console.get("/?by=weight").await.status, 400);
    // What a drain of shard_1 would change, drawn from the planner: nothing is recorded.
    let drain = console.get("/?plan=drain&shard=shard_1&by=rows").await;
    assert_eq!(drain.status, 200, "{}", drain.body);
    assert!(
        drain
            .body
            .contains("<td>tenant/c1</td><td>shard_1</td><td>shard_2</td>"),
        "{}",
        drain.body
    );
    assert!(
        drain.body.contains("<td class=\"n\">1 → 0</td>"),
        "{}",
        drain.body
    );
    assert!(drain
        .body
        .contains("shard-directory drain shard_1 --by rows --apply"));
    assert_eq!(console.get("/?plan=split&shard=shard_1").await.status, 400);
    assert_eq!(console.get("/?plan=explode").await.status, 400);
    let batches: i64 = t
        .dba()
        .await
        .query_one(
            "SELECT count(*) FROM shard_directory.shard_move_batches",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(batches, 0, "a plan drawn is not a batch recorded");
    let home = console.get_with("", &[]).await;
    assert_eq!(
        home.status, 308,
        "the base path alone redirects to its page"
    );

    // A move under a writer, watched live.
    let mut watcher = console.watch().await;
    let (first, _) = watcher.next().await.expect("the list at once");
    assert_eq!(first, "moves");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = async { t.keep_ordering("c1", stopped).await };
    let mover = async {
        let move_id = move_to_shard_2(&t, "c1", MoveOptions::default()).await;
        stop.send(true).unwrap();
        move_id
    };
    let watched = watcher.until(Duration::from_secs(120), |html| {
        html.contains("data-phase=\"done\"")
    });
    let (move_id, acked, seen) = tokio::join!(mover, writer, watched);
    assert!(acked > 0, "the writer wrote");
    // The phases the page was shown, in the order of a logical move, ending done.
    let shown: Vec<String> = seen.iter().filter_map(|h| phase_of(h, move_id)).collect();
    let order = shard_directory_mover::Method::Logical.phases();
    let mut at = 0;
    for phase in &shown {
        // A phase shown again (its progress changed) is in order too.
        at += order[at..]
            .iter()
            .position(|p| p.as_str() == phase)
            .unwrap_or_else(|| panic!("{phase} out of order in {shown:?}"));
    }
    assert_eq!(shown.last().map(String::as_str), Some(Phase::Done.as_str()));
    assert!(
        shown.len() >= 3,
        "the page walked through the phases: {shown:?}"
    );

    let tenant = console.get("/tenants/tenant/c1").await;
    assert_eq!(tenant.status, 200);
    assert!(
        tenant.body.contains("On <strong>shard_2</strong>, active"),
        "{}",
        tenant.body
    );
    assert!(
        tenant
            .body
            .contains(&format!("href=\"/console/moves/{move_id}\"")),
        "{}",
        tenant.body
    );
    let before = console.get("/tenants/tenant/c1?at=2000-01-01").await;
    assert!(
        before.body.contains("At 2000-01-01: no entry"),
        "{}",
        before.body
    );
    let detail = console.get(&format!("/moves/{move_id}")).await;
    assert_eq!(detail.status, 200);
    // The seed's lines (the writer writes orders alone), each copied.
    let lines = "public.order_lines</td><td class=\"n\">1000</td><td class=\"n\">1000</td>";
    assert!(detail.body.contains(lines), "{}", detail.body);
    assert_eq!(console.get("/moves/999999").await.status, 404);
    let found = console
        .get("/tenant?entity_type=tenant&entity_id=c%2F1")
        .await;
    assert_eq!(found.status, 303);
    assert!(
        found
            .headers
            .contains("location: /console/tenants/tenant/c%2F1"),
        "{}",
        found.headers
    );
    let metrics = console.metrics().await;
    assert_eq!(sample(&metrics, "shard_directory_console_listening"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_watchers_cost_the_directory_one_session_and_each_sees_the_move() {
    let t = Topology::start("console-watchers").await;
    t.add_tenant("w1", "shard_1").await;
    let console = Console::start(&t, "", &[]).await;
    let mut watchers = Vec::new();
    for _ in 0..100 {
        let mut w = console.watch().await;
        w.next().await.expect("the list at once");
        watchers.push(w);
    }
    let metrics = console.metrics().await;
    assert_eq!(sample(&metrics, "shard_directory_console_watchers"), 100.0);
    let sessions: i64 = t
        .dba()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&"shard-directory console"],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sessions, 1, "one directory session for a hundred watchers");
    let move_id = move_to_shard_2(&t, "w1", MoveOptions::default()).await;
    for w in &mut watchers {
        w.until(Duration::from_secs(60), |html| {
            phase_of(html, move_id).as_deref() == Some("done")
        })
        .await;
    }
    drop(watchers);
    shard_directory_e2e::eventually(
        "the watchers to be gone",
        Duration::from_secs(10),
        || async {
            let text = console.metrics().await;
            (sample(&text, "shard_directory_console_watchers") == 0.0).then_some(())
        },
    )
    .await;
}

/// Headless Chromium driven through chromedriver (WebDriver), both stopped on drop.
pub(crate) struct Browser {
    pub(crate) client: fantoccini::Client,
    _driver: tokio::process::Child,
}

impl Browser {
    pub(crate) async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver (scripts/setup.sh installs chromium-driver)");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,700"]
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = shard_directory_e2e::eventually(
            "chromedriver to answer",
            Duration::from_secs(30),
            || {
                let (url, capabilities) = (url.clone(), capabilities.clone());
                async move {
                    fantoccini::ClientBuilder::native()
                        .capabilities(capabilities)
                        .connect(&url)
                        .await
                        .ok()
                }
            },
        )
        .await;
        Browser {
            client,
            _driver: driver,
        }
    }

    /// Signs in on the sign-in form shown, with `token`: the fleet page follows.
    pub(crate) async fn sign_in(&self, token: &str) {
        use fantoccini::Locator;
        let c = &self.client;
        c.find(Locator::Css("input[name='token']"))
            .await
            .unwrap()
            .send_keys(token)
            .await
            .unwrap();
        self.click("form[action$='/login'] button").await;
        let signed_in = c
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("#shards"))
            .await;
        if signed_in.is_err() {
            panic!(
                "signed in: the fleet; the page: {}",
                c.source().await.unwrap()
            );
        }
    }

    /// Clicks the element `css` selects on the page.
    pub(crate) async fn click(&self, css: &str) {
        let found = self.client.find(fantoccini::Locator::Css(css)).await;
        let element = found.unwrap_or_else(|e| panic!("{css} on the page: {e}"));
        element
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// A screenshot of the page into `$SD_CONSOLE_SCREENSHOTS/<name>.png`, when that is set
    /// (how docs/console/ was made).
    pub(crate) async fn screenshot(&self, name: &str) {
        if let Some(dir) = std::env::var_os("SD_CONSOLE_SCREENSHOTS") {
            let png = self.client.screenshot().await.expect("a screenshot");
            let path = std::path::Path::new(&dir).join(format!("{name}.png"));
            std::fs::write(&path, png).expect("write the screenshot");
        }
    }
}

/// In a real browser: the moves page, loaded once, shows the move appear and walk to `done`
/// (the page is not reloaded: a mark left on it stays), and times in the browser's zone with
/// UTC on hover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sees_a_move_walk_through_its_phases_without_reloading() {
    use fantoccini::Locator;

    let t = Topology::start("console-browser").await;
    for (id, shard, orders) in [
        ("b1", "shard_1", 2000),
        ("b2", "shard_1", 300),
        ("b3", "shard_2", 800),
    ] {
        t.add_tenant(id, shard).await;
        t.seed_orders(shard, id, orders, 2).await;
    }
    let console = Console::start(&t, "/console", &[]).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    let home = format!("http://{}/console/", console.addr);
    c.goto(&home).await.unwrap();
    let shards = c.find_all(Locator::Css("#shards tbody tr")).await.unwrap();
    assert_eq!(shards.len(), 2, "a row per shard");
    // The rebalance form, filled in as it stands: the plan drawn before and after.
    browser
        .click("form:has(input[value='rebalance']) button")
        .await;
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("#plan tr[data-shard='shard_2'] span.after"))
        .await
        .expect("the plan is drawn");
    browser.screenshot("fleet").await;

    c.goto(&format!("{home}moves")).await.unwrap();
    c.execute("window.kept = 'mark'; return null", vec![])
        .await
        .unwrap();
    // The first event (the list as it is) arrived: the stream is open.
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("#moves[data-updated]"))
        .await
        .expect("the page hears the console's events");
    // Paced (6,000 rows at 2,000 a second), so that the copy is seen under way.
    let paced = MoveOptions {
        max_rate: Some(2000),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = async { t.keep_ordering("b1", stopped).await };
    let mover = async {
        let move_id = move_to_shard_2(&t, "b1", paced).await;
        stop.send(true).unwrap();
        move_id
    };
    let watched = async {
        c.wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(
                "tr[data-move][data-phase='copying'] progress:not([value='0'])",
            ))
            .await
            .expect("the move is seen copying, its progress growing");
        browser.screenshot("moves").await;
        let done = "tr[data-move][data-phase='done']";
        c.wait()
            .at_most(Duration::from_secs(60))
            .for_element(Locator::Css(done))
            .await
            .expect("the move reaches done on the page");
    };
    let (move_id, acked, ()) = tokio::join!(mover, writer, watched);
    assert!(acked > 0, "the writer wrote");
    let done = format!("tr[data-move='{move_id}'][data-phase='done']");
    let kept = c.execute("return window.kept", vec![]).await.unwrap();
    assert_eq!(kept, serde_json::json!("mark"), "the page was not reloaded");
    let started = c.find(Locator::Css(&format!("{done} time"))).await.unwrap();
    let utc = started.attr("title").await.unwrap().expect("UTC on hover");
    assert!(utc.ends_with('Z'), "{utc}");
    let shown = started.text().await.unwrap();
    assert_ne!(
        shown, utc,
        "the time in the browser's zone, not the server's text"
    );
    // Read-only (no --allow-actions): the move's page offers no action, a drawn plan no run,
    // and the actions page says so.
    c.goto(&format!("{home}moves/{move_id}")).await.unwrap();
    c.find(Locator::Css("dd.phase"))
        .await
        .expect("the move's page");
    let offered = c.find_all(Locator::Css("a.action, button.action, form[method='post']"));
    assert!(offered.await.unwrap().is_empty(), "no action offered");
    c.goto(&format!("{home}?by=rows&plan=drain&shard=shard_1"))
        .await
        .unwrap();
    c.find(Locator::Css("#plan")).await.expect("the plan drawn");
    let run = c.find_all(Locator::Css("form.run, button.action"));
    assert!(run.await.unwrap().is_empty(), "no plan to run");
    c.goto(&format!("{home}actions")).await.unwrap();
    let said = c
        .find(Locator::Css("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(said.contains("read-only"), "{said}");
    browser.client.clone().close().await.unwrap();
}

pub(crate) const TOKEN: &str = "alice-0123456789abcdef";

/// A console with actions, its users file (alice) and audit log in the directory's folder.
pub(crate) async fn console_with_actions(t: &Topology) -> (Console, std::path::PathBuf) {
    let users = t.directory.scratch_path("console-users");
    std::fs::write(&users, format!("# the console's users\nalice:{TOKEN}\n")).unwrap();
    let audit = t.directory.scratch_path("console-audit.jsonl");
    let args = [
        "--allow-actions",
        "--token-file",
        users.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ];
    (Console::start(t, "", &args).await, audit)
}

/// A move of tenant `id` to shard_2 killed while it copies: open, resumable, its lock free.
pub(crate) async fn stopped_move(t: &Topology, id: &str) -> i64 {
    t.add_tenant(id, "shard_1").await;
    t.seed_orders("shard_1", id, 3000, 2).await;
    let killed = shard_directory_e2e::mover_cli::kill_at(
        t,
        id,
        "shard_2",
        "logical",
        Phase::Copying,
        Duration::ZERO,
    )
    .await
    .expect("killed while copying");
    killed.move_id
}

/// A logical move of tenant `id` (300 orders on shard_1) to shard_2 killed while it catches up:
/// open, its slot on shard_1, its subscription streaming.
pub(crate) async fn catching_up(t: &Topology, id: &str) -> i64 {
    t.add_tenant(id, "shard_1").await;
    t.seed_orders("shard_1", id, 300, 1).await;
    shard_directory_e2e::mover_cli::kill_at(
        t,
        id,
        "shard_2",
        "logical",
        Phase::CatchingUp,
        Duration::ZERO,
    )
    .await
    .expect("killed while catching up")
    .move_id
}

/// The value of the hidden input `name` in a form of `html`.
pub(crate) fn hidden(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + marker.len();
    html[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_needs_the_token_a_form_of_this_console_and_a_confirmation_and_is_recorded() {
    let t = Topology::start("console-actions").await;
    let move_id = stopped_move(&t, "a1").await;
    let (console, audit) = console_with_actions(&t).await;
    let bearer = format!("Authorization: Bearer {TOKEN}");

    // Without the token: refused, pages and actions alike; the assets and login are open.
    assert_eq!(console.get("/").await.status, 401);
    assert_eq!(console.get("/metrics").await.status, 401);
    assert_eq!(console.get("/assets/console.css").await.status, 200);
    let wrong = console
        .get_with("/", &["Authorization: Bearer alice-wrong-token-0000"])
        .await;
    assert_eq!(wrong.status, 401);
    let login = console.post("/login", &[], &format!("token={TOKEN}")).await;
    assert_eq!(login.status, 303, "{}", login.body);
    let cookie = login
        .headers
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert!(
        login.headers.contains("HttpOnly; SameSite=Strict"),
        "{}",
        login.headers
    );
    let by_cookie = console.get_with("/", &[&format!("Cookie: {cookie}")]).await;
    assert_eq!(by_cookie.status, 200);

    let page = console
        .get_with(&format!("/moves/{move_id}"), &[&bearer])
        .await;
    assert!(
        page.body
            .contains(&format!("href=\"/moves/{move_id}/abort\"")),
        "{}",
        page.body
    );
    let form = console
        .get_with(&format!("/moves/{move_id}/abort"), &[&bearer])
        .await;
    assert_eq!(
        form.status, 200,
        "a GET shows the form, and changes nothing"
    );
    let csrf = hidden(&form.body, "csrf");
    let path = format!("/moves/{move_id}/abort");
    // Refused, and nothing done: no CSRF token, another site's origin, no confirmation.
    let refusals = [
        (console.post(&path, &[&bearer], "confirm=yes").await, 422),
        (
            console.post(&path, &[&bearer], "csrf=00&confirm=yes").await,
            403,
        ),
        (
            console
                .post(
                    &path,
                    &[&bearer, "Origin: http://evil.example"],
                    &format!("csrf={csrf}&confirm=yes"),
                )
                .await,
            403,
        ),
        (
            console
                .post(&path, &[&bearer], &format!("csrf={csrf}"))
                .await,
            400,
        ),
        (
            console
                .post(&path, &[], &format!("csrf={csrf}&confirm=yes"))
                .await,
            401,
        ),
    ];
    for (page, status) in refusals {
        assert_eq!(page.status, status, "{}", page.body);
    }
    let phase = shard_directory_e2e::mover_cli::open_phase(&t, "a1").await;
    assert_eq!(
        phase.map(|(id, _)| id),
        Some(move_id),
        "still open: nothing was done"
    );

    let asked = console
        .post(&path, &[&bearer], &format!("csrf={csrf}&confirm=yes"))
        .await;
    assert_eq!(asked.status, 303, "{}", asked.body);
    shard_directory_e2e::eventually("the move aborted", Duration::from_secs(60), || async {
        shard_directory_e2e::mover_cli::open_phase(&t, "a1")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        t.entry("tenant", "a1").await.0,
        "shard_1",
        "the tenant where it was"
    );
    assert_eq!(
        t.rows("shard_1", "a1").await,
        (3000, 6000),
        "its rows where they were"
    );
    assert_eq!(t.rows("shard_2", "a1").await, (0, 0));
    let log = shard_directory_e2e::eventually(
        "the outcome recorded",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(&audit).unwrap_or_default();
            log.contains("\"outcome\":\"done\"").then_some(log)
        },
    )
    .await;
    let target = format!("\"target\":\"move {move_id}\"");
    for line in log.lines() {
        assert!(
            line.contains("\"user\":\"alice\"") && line.contains("\"action\":\"abort\""),
            "{line}"
        );
        assert!(line.contains(&target), "{line}");
    }
    assert_eq!(log.lines().count(), 2, "started, then done: {log}");
    let recorded = console.get_with("/actions", &[&bearer]).await;
    assert!(
        recorded.body.contains("<td>alice</td><td>abort</td>"),
        "{}",
        recorded.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_console_offers_no_action_and_serves_none() {
    let t = Topology::start("console-read-only").await;
    let move_id = stopped_move(&t, "r1").await;
    let console = Console::start(&t, "", &[]).await;
    let page = console.get(&format!("/moves/{move_id}")).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("/abort\""), "{}", page.body);
    assert_eq!(
        console.get(&format!("/moves/{move_id}/abort")).await.status,
        404
    );
    let post = console
        .post(&format!("/moves/{move_id}/abort"), &[], "confirm=yes")
        .await;
    assert!(post.status == 404 || post.status == 405, "{}", post.status);
    let phase = shard_directory_e2e::mover_cli::open_phase(&t, "r1").await;
    assert_eq!(phase.map(|(id, _)| id), Some(move_id), "still open");
    // Actions need users: refused at start, with the usage exit code.
    let out = shard_directory_e2e::mover_cli::command(&t)
        .args(["console", "--listen", "127.0.0.1:0", "--allow-actions"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        shard_directory_e2e::mover_cli::text(&out.stderr)
    );
}

/// In a real browser, actions allowed: a request without the token gets the sign-in form; signed
/// in, an abort asked from the move's page (its confirmation ticked) leaves the tenant where it
/// was, with its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_and_aborts_a_move_from_its_page() {
    use fantoccini::Locator;

    let t = Topology::start("console-browser-abort").await;
    let move_id = stopped_move(&t, "x1").await;
    let (console, _audit) = console_with_actions(&t).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    let page = format!("http://{}/moves/{move_id}", console.addr);
    c.goto(&page).await.unwrap();
    assert_eq!(
        c.title().await.unwrap(),
        "Sign in · shard_directory",
        "no token: refused"
    );
    assert!(
        c.find(Locator::Css(".phase")).await.is_err(),
        "nothing of the move shown"
    );
    browser.sign_in(TOKEN).await;
    c.goto(&page).await.unwrap();
    browser.click("a.action[href$='/abort']").await;
    browser.click("input[name='confirm']").await;
    browser.click("button.action").await;
    shard_directory_e2e::eventually(
        "the page to say aborted",
        Duration::from_secs(60),
        || async {
            c.goto(&page).await.ok()?;
            let phase = c
                .find(Locator::Css("dd.phase"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (phase == "aborted").then_some(())
        },
    )
    .await;
    assert_eq!(
        t.entry("tenant", "x1").await.0,
        "shard_1",
        "the tenant where it was"
    );
    assert_eq!(
        t.rows("shard_1", "x1").await,
        (3000, 6000),
        "its rows where they were"
    );
    assert_eq!(t.rows("shard_2", "x1").await, (0, 0));
    browser.client.clone().close().await.unwrap();
}

/// Asked to stop (SIGTERM) while pages watch the moves, the console stops at once, exit 0: it does
/// not wait for the pages to close their event streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_stops_when_asked_even_with_pages_watching() {
    let t = Topology::start("console-stop").await;
    let console = Console::start(&t, "", &[]).await;
    let mut watchers = Vec::new();
    for _ in 0..3 {
        let mut w = console.watch().await;
        w.next().await.expect("the list at once");
        watchers.push(w);
    }
    assert_eq!(console.stop(Duration::from_secs(10)).await, Some(0));
}

/// The cells of table `table`'s row on a tenant page: (rows, bytes).
pub(crate) fn table_row(html: &str, table: &str) -> Option<(i64, i64)> {
    let at = html.find(&format!("data-table=\"{table}\""))?;
    let cell = |name: &str| -> Option<i64> {
        let marker = format!("{name}=\"");
        let from = html[at..].find(&marker)? + at + marker.len();
        html[from..].split('"').next()?.parse().ok()
    };
    Some((cell("data-rows")?, cell("data-bytes")?))
}

/// A tenant's page counts its rows and bytes in each table on the shard its entry names (the
/// other tenants' rows not counted), on its new shard once moved; with that shard down the rest
/// of the page still answers and says why the rows are not shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_page_counts_its_rows_and_bytes_per_table_on_its_shard() {
    let t = Topology::start("console-tenant-rows").await;
    t.add_tenant("c1", "shard_1").await;
    t.seed_orders("shard_1", "c1", 120, 3).await;
    t.add_tenant("c2", "shard_1").await;
    t.seed_orders("shard_1", "c2", 7, 1).await;
    let console = Console::start(&t, "", &[]).await;
    let on = |shard: &'static str| {
        let console = &console;
        let t = &t;
        async move {
            let page = console.get("/tenants/tenant/c1").await;
            assert_eq!(page.status, 200, "{}", page.body);
            assert!(
                page.body.contains(&format!("Rows on {shard}")),
                "{}",
                page.body
            );
            let (orders, lines) = t.rows(shard, "c1").await;
            let shown_orders = table_row(&page.body, "public.orders").expect("orders counted");
            let shown_lines = table_row(&page.body, "public.order_lines").expect("lines counted");
            assert_eq!((shown_orders.0, shown_lines.0), (orders, lines));
            assert_eq!((orders, lines), (120, 360), "the seed, not c2's rows");
            assert!(shown_orders.1 > 0 && shown_lines.1 > 0, "{}", page.body);
            (shown_orders.1, shown_lines.1)
        }
    };
    let before = on("shard_1").await;
    move_to_shard_2(&t, "c1", MoveOptions::default()).await;
    let after = on("shard_2").await;
    assert_eq!(before, after, "the same rows, the same bytes");
    t.shards[1].1.stop();
    let page = console.get("/tenants/tenant/c1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("could not be counted") && page.body.contains("History"),
        "{}",
        page.body
    );
}

/// The cell `class` of move `id`'s row in a moves list.
pub(crate) fn cell_of(html: &str, id: i64, class: &str) -> Option<String> {
    let row = html.find(&format!("data-move=\"{id}\""))?;
    let end = html[row..].find("</tr>")? + row;
    let marker = format!("class=\"{class}\">");
    let at = html[row..end].find(&marker)? + row + marker.len();
    Some(html[at..].split('<').next()?.to_owned())
}

/// On the live list an open logical move shows its slot's lag and retained WAL, as read from its
/// source; the move's page says the same slot, and `status --json` names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_list_shows_an_open_moves_lag_and_retained_wal() {
    let t = Topology::start("console-lag").await;
    let move_id = catching_up(&t, "l1").await;
    let status = shard_directory_e2e::mover_cli::command(&t)
        .args(["status", &move_id.to_string(), "--json"])
        .output()
        .await
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let slot = &status["slot"];
    assert!(slot["retained_wal_bytes"].as_i64().is_some(), "{status}");
    assert!(slot["lag_bytes"].as_i64().is_some(), "{status}");
    let console = Console::start(&t, "", &[]).await;
    let mut events = console.watch().await;
    let seen = events
        .until(Duration::from_secs(30), |d| {
            cell_of(d, move_id, "n retained").is_some_and(|c| c.ends_with('B'))
                && cell_of(d, move_id, "n lag").is_some_and(|c| c.ends_with('B'))
        })
        .await;
    let retained = cell_of(seen.last().unwrap(), move_id, "n retained").unwrap();
    let detail = console.get(&format!("/moves/{move_id}")).await;
    let name = slot["name"].as_str().unwrap();
    assert!(
        detail.body.contains(name) && detail.body.contains(" behind"),
        "{}",
        detail.body
    );
    assert!(!retained.is_empty());
    // A copy move streams through no slot: nothing shown.
    t.add_tenant("l2", "shard_2").await;
    let copied = t
        .mover(MoveOptions {
            method: shard_directory_mover::MethodChoice::Copy,
            ..Default::default()
        })
        .start(&EntityKey::new("tenant", "l2"), "shard_1")
        .await
        .unwrap();
    let seen = events
        .until(Duration::from_secs(30), |d| {
            phase_of(d, copied.move_id).as_deref() == Some("done")
        })
        .await;
    let last = seen.last().unwrap();
    assert_eq!(cell_of(last, copied.move_id, "n lag").as_deref(), Some(""));
}
