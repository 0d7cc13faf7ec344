//! `console`: a web console over the directory. It shows the fleet (each shard's
//! entities, rows, bytes and load, drawn as bars), each move live (its phase, progress per table,
//! rate and ETA, pushed to the page as server-sent events), and a tenant's place and history
//! ("where was it in March"). Each page reads through the same library calls as the CLI
//! commands. A GET changes nothing. Read-only unless started with `--allow-actions`, which
//! needs `--token-file`.
//!
//! - `live`: the one directory session (LISTEN and the moves' reads), shared by every watcher;
//! - `pages`: the HTML, rendered on the server, with `console.css` and `console.js` embedded;
//! - `auth`: `--token-file`'s users, their login and the forms' CSRF tokens;
//! - `tls`: the console's own HTTPS (`--tls-cert`, `--tls-key`);
//! - `actions`: what `--allow-actions` serves (a move's abort, resume, revert, finalize; a
//!   batch's pause, resume, abort; a drawn plan run), each confirmed by a form and recorded.

mod actions;
mod auth;
mod live;
mod pages;
mod tls;

use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, MatchedPath, Path, Query, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use futures_util::Stream;
use maud::Markup;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use shard_directory_mover::{with_password, BatchOptions, BatchPlan, Error, Fleet, Mover, Weigh};
use shard_directory_protocol::EntityKey;

use crate::output::Outcome;
use live::Live;

#[derive(clap::Args)]
pub struct ConsoleArgs {
    /// Where to serve the console (address:port; port 0 picks a free one, printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The path the console is served under, behind a reverse proxy (e.g. /console).
    #[arg(long, default_value = "", value_parser = base_path)]
    base_path: String,
    /// Users and their tokens, a `name:token` line each (tokens of 16 characters or more):
    /// every page then asks for one (a login form, or `Authorization: Bearer <token>`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Serve the actions: abort, resume, revert and finalize a move; pause, resume and abort a
    /// batch; run a drain, split or rebalance drawn on the fleet page. Needs --token-file.
    #[arg(long, requires = "token_file")]
    allow_actions: bool,
    /// Append every action (who, when, what, how it ended) to this file, a JSON line each; it
    /// is also logged to stderr and listed at /actions.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Serve HTTPS with this certificate (PEM, the chain from the console's own certificate up).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM, PKCS #8).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn base_path(s: &str) -> Result<String, String> {
    let trimmed = s.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    // Segments of letters, digits and `-._~`: a path that needs no percent-encoding, which the
    // router matches as written.
    let plain = |seg: &str| {
        !seg.is_empty()
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
    };
    let Some(rest) = trimmed.strip_prefix('/') else {
        return Err(format!("{s}: a path such as /console"));
    };
    if !rest.split('/').all(plain) {
        return Err(format!(
            "{s}: a path such as /console, of letters, digits and -._~ between its slashes"
        ));
    }
    Ok(trimmed.to_owned())
}

struct Console {
    mover: Arc<Mover>,
    live: Live,
    base: String,
    metrics: PrometheusHandle,
    users: Option<auth::Users>,
    actions: bool,
    audit: Arc<actions::Audit>,
    /// Served over HTTPS: the login cookie is `Secure`.
    https: bool,
}

/// The user a request was authenticated as (with `--token-file`).
#[derive(Clone)]
struct User(String);

type Shared = State<Arc<Console>>;

/// Serves the console until the process is asked to stop.
pub async fn console(
    mover: Mover,
    directory: tokio_postgres::Config,
    args: ConsoleArgs,
) -> Result<(), Outcome> {
    let metrics = PrometheusBuilder::new().install_recorder().map_err(|e| {
        Outcome::Usage(format!(
            "the console serves its own /metrics (drop --metrics-addr): {e}"
        ))
    })?;
    let base = args.base_path;
    let users = match &args.token_file {
        Some(path) => Some(auth::Users::load(path).map_err(Outcome::Usage)?),
        None => None,
    };
    let audit = actions::Audit::open(args.audit_log.as_ref()).map_err(Outcome::Usage)?;
    let acceptor = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key).await.map_err(Outcome::Usage)?),
        _ => None,
    };
    let live = Live::start(with_password(directory), mover.slots());
    let console = Arc::new(Console {
        mover: Arc::new(mover),
        live,
        base: base.clone(),
        metrics,
        users,
        actions: args.allow_actions,
        audit: Arc::new(audit),
        https: acceptor.is_some(),
    });
    let at = |path: &str| format!("{base}{path}");
    let mut routes = Router::new()
        .route(&at("/"), get(fleet))
        .route(&at("/moves"), get(moves))
        .route(&at("/moves/{move_id}"), get(move_detail))
        .route(&at("/tenant"), get(find_tenant))
        .route(&at("/tenants/{entity_type}/{entity_id}"), get(tenant))
        .route(&at("/events"), get(events))
        .route(&at("/metrics"), get(prometheus))
        .route(&at("/batches/{batch_id}"), get(batch))
        .route(&at("/batches/{batch_id}/events"), get(batch_events))
        .route(&at("/actions"), get(recorded))
        .route(&at("/login"), get(login_form).post(login))
        .route(&at("/assets/console.css"), get(css))
        .route(&at("/assets/console.js"), get(js));
    if args.allow_actions {
        routes = routes
            .route(
                &at("/moves/{move_id}/{action}"),
                get(confirm_move).post(act_on_move),
            )
            .route(
                &at("/batches/{batch_id}/{action}"),
                get(confirm_batch).post(act_on_batch),
            )
            .route(&at("/plans/run"), post(run_plan));
    }
    if !base.is_empty() {
        let home = at("/");
        routes = routes.route(
            &base,
            get(move || async move { Redirect::permanent(&home) }),
        );
    }
    let app = routes
        .layer(middleware::from_fn_with_state(
            console.clone(),
            authenticated,
        ))
        .layer(middleware::from_fn(counted))
        .with_state(console);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Outcome::Usage(format!("--listen {}: {e}", args.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Outcome::Failed(1, format!("console: {e}")))?;
    // One line on stdout, for scripts (and the tests) that picked port 0.
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    println!("console: {scheme}://{bound}{base}/");
    let served = async move {
        let served = match acceptor {
            Some(acceptor) => {
                let listener = tls::TlsListener::new(listener, acceptor)
                    .map_err(|e| Outcome::Failed(1, format!("console: {e}")))?;
                axum::serve(listener, app).into_future().await
            }
            None => axum::serve(listener, app).into_future().await,
        };
        served.map_err(|e| Outcome::Failed(1, format!("console: {e}")))
    };
    // Stopped at once when asked: a graceful shutdown would wait for every event stream, and
    // those end only when their pages close. An action under way is left as its CLI command
    // killed would leave it (resumable).
    tokio::select! {
        served = served => served,
        () = crate::moves::interrupted() => Ok(()),
    }
}

/// Counts each request by its route.
async fn counted(path: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let route = path.map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("shard_directory_console_requests_total", "route" => route, "status" => status)
        .increment(1);
    response
}

/// Why a page could not be made.
enum Problem {
    Mover(Error),
    /// The directory or a shard did not answer in time.
    Slow,
}

impl From<Error> for Problem {
    fn from(e: Error) -> Problem {
        Problem::Mover(e)
    }
}

/// How long a page may wait for the directory and the shards: a server that accepts connections
/// and answers nothing gets an error page, not a request that never ends.
const PAGE_WITHIN: Duration = Duration::from_secs(20);

/// How long the tenant page's count of its rows may run on its shard (`statement_timeout`).
const COUNT_WITHIN: Duration = Duration::from_secs(10);

/// `read`, within [`PAGE_WITHIN`].
async fn within<T>(read: impl Future<Output = Result<T, Error>>) -> Result<T, Problem> {
    match tokio::time::timeout(PAGE_WITHIN, read).await {
        Ok(read) => Ok(read?),
        Err(_) => Err(Problem::Slow),
    }
}

/// A page, or an error page with the status that says why: 404 an unknown move or batch, 400
/// input the server refused (SQLSTATE class 22: a time that is not one, a NUL), 504 no answer
/// in time, 502 any other failure of the directory or a shard.
fn answer(c: &Console, title: &str, made: Result<Markup, Problem>) -> Response {
    let (status, message) = match made {
        Ok(body) => return pages::page(&c.base, title, body).into_response(),
        Err(Problem::Slow) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("the directory or a shard did not answer within {PAGE_WITHIN:?}"),
        ),
        Err(Problem::Mover(e)) => {
            let status = match &e {
                Error::UnknownMove(_) | Error::UnknownBatch(_) => StatusCode::NOT_FOUND,
                Error::Config(_) => StatusCode::BAD_REQUEST,
                Error::Db { source, .. }
                    if source.code().is_some_and(|c| c.code().starts_with("22")) =>
                {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::BAD_GATEWAY,
            };
            (status, e.to_string())
        }
    };
    (status, pages::error(&c.base, title, &message)).into_response()
}

#[derive(Deserialize)]
struct FleetQuery {
    by: Option<String>,
    /// A plan to draw: `drain`, `split` or `rebalance`, with its settings.
    plan: Option<String>,
    shard: Option<String>,
    to: Option<String>,
    fraction: Option<f64>,
    tolerance: Option<f64>,
    max_moves: Option<usize>,
}

impl FleetQuery {
    fn by(&self) -> Result<Weigh, String> {
        match self.by.as_deref() {
            None | Some("bytes") => Ok(Weigh::Bytes),
            Some("rows") => Ok(Weigh::Rows),
            Some("load") => Ok(Weigh::Load),
            Some(other) => Err(format!("by={other}: bytes, rows or load")),
        }
    }

    /// The CLI command that plans (and with `--apply` runs) the plan asked, its settings all
    /// given.
    fn command(&self, by: Weigh) -> String {
        let shard = self.shard.as_deref().unwrap_or_default();
        let to = self
            .to
            .as_deref()
            .map(|t| format!(" --to {t}"))
            .unwrap_or_default();
        let by = pages::weigh_name(by);
        match self.plan.as_deref() {
            Some("drain") => format!("shard-directory drain {shard}{to} --by {by} --apply"),
            Some("split") => format!(
                "shard-directory split {shard}{to} --fraction {} --by {by} --apply",
                self.fraction.unwrap_or(0.5)
            ),
            _ => format!(
                "shard-directory rebalance --tolerance {} --max-moves {} --by {by} --apply",
                self.tolerance.unwrap_or(0.1),
                self.max_moves.unwrap_or(100)
            ),
        }
    }

    /// The plan asked, from the planners the CLI's `drain`, `split` and `rebalance` use.
    fn plan(&self, fleet: &Fleet, by: Weigh) -> Result<Option<BatchPlan>, String> {
        let shard = || self.shard.as_deref().ok_or("plan: which shard (shard=)");
        let planned = match self.plan.as_deref() {
            None => return Ok(None),
            Some("drain") => {
                let to: Vec<String> = self.to.iter().map(String::from).collect();
                shard_directory_mover::drain(fleet, shard()?, &to, by)
            }
            Some("split") => {
                let to = self
                    .to
                    .as_deref()
                    .ok_or("plan=split: to which shard (to=)")?;
                let fraction = self.fraction.unwrap_or(0.5);
                shard_directory_mover::split(fleet, shard()?, to, fraction, by)
            }
            Some("rebalance") => shard_directory_mover::rebalance(
                fleet,
                by,
                self.tolerance.unwrap_or(0.1),
                self.max_moves.unwrap_or(100),
            ),
            Some(other) => return Err(format!("plan={other}: drain, split or rebalance")),
        };
        planned.map(Some).map_err(|e| e.to_string())
    }
}

/// What a drawn plan is known by: its moves (entity, from, to). The run form carries it, and a
/// plan made again when the form is sent runs only if it is still the one drawn.
fn digest(plan: &BatchPlan) -> String {
    let mut h = Sha256::new();
    for m in &plan.moves {
        for part in [&m.entity_type, &m.entity_id, &m.from, &m.to] {
            h.update(part.as_bytes());
            h.update([0]);
        }
    }
    hex::encode(h.finalize())
}

async fn fleet(
    State(c): Shared,
    user: Option<Extension<User>>,
    RawQuery(raw): RawQuery,
    Query(q): Query<FleetQuery>,
) -> Response {
    let bad = |message: String| {
        (
            StatusCode::BAD_REQUEST,
            pages::error(&c.base, "Fleet", &message),
        )
            .into_response()
    };
    let by = match q.by() {
        Ok(by) => by,
        Err(message) => return bad(message),
    };
    // A shard of extension 0.1.0 has no entity_stats(): the fleet without load, then. Sizes
    // measured now are not kept (a GET changes nothing). Both tries run within one page's
    // bound: a first that fails late leaves the second only what is left.
    let seen = within(async {
        match c.mover.fleet_as_seen(true).await {
            Err(_) => c.mover.fleet_as_seen(false).await,
            seen => seen,
        }
    });
    // The wait for the live session's first read runs beside the fleet's read, not after it.
    let (fleet, live) = tokio::join!(seen, c.live.read());
    let fleet = match fleet {
        Ok(f) => f,
        Err(e) => return answer(&c, "Fleet", Err(e)),
    };
    let plan = match q.plan(&fleet, by) {
        Ok(plan) => plan,
        Err(message) => return bad(message),
    };
    // With actions, a drawn plan that moves something can be run from the page.
    let run = match (&plan, &user, &c.users) {
        (Some(p), Some(Extension(user)), Some(users)) if c.actions && !p.moves.is_empty() => {
            Some(pages::RunForm {
                action: format!("{}/plans/run?{}", c.base, raw.unwrap_or_default()),
                csrf: users.csrf(&user.0),
                once: users.once(&user.0),
                digest: digest(p),
            })
        }
        _ => None,
    };
    let asked = plan.as_ref().map(|p| (p, q.command(by), run));
    let body = maud::html! {
        (pages::fleet(&c.base, &fleet, by, &live))
        (pages::plans(&c.base, &fleet, by, asked))
    };
    answer(&c, "Fleet", Ok(body))
}

#[derive(Deserialize)]
struct MovesQuery {
    all: Option<String>,
}

async fn moves(State(c): Shared, Query(q): Query<MovesQuery>) -> Response {
    if q.all.is_some() {
        let made = within(c.mover.list(false, None)).await;
        let made = made.map(|m| pages::moves_rows(&c.base, &m, None, "No move was ever made."));
        return answer(&c, "Every move", made);
    }
    let live = c.live.read().await;
    let body = pages::moves(&c.base, &live);
    answer(&c, "Moves", Ok(body))
}

async fn move_detail(State(c): Shared, Path(move_id): Path<i64>) -> Response {
    let made = within(c.mover.status_detail(move_id)).await;
    let made = made.map(|s| pages::move_detail(&c.base, &s, c.actions));
    answer(&c, &format!("Move {move_id}"), made)
}

#[derive(Deserialize)]
struct Find {
    entity_type: String,
    entity_id: String,
}

/// The navigation's form: to the tenant's own page, whose address can be shared.
async fn find_tenant(State(c): Shared, Query(f): Query<Find>) -> Redirect {
    Redirect::to(&format!(
        "{}/tenants/{}/{}",
        c.base,
        pages::url(&f.entity_type),
        pages::url(&f.entity_id)
    ))
}

#[derive(Deserialize)]
struct At {
    at: Option<String>,
}

async fn tenant(
    State(c): Shared,
    Path((entity_type, entity_id)): Path<(String, String)>,
    Query(q): Query<At>,
) -> Response {
    let key = EntityKey::new(entity_type, entity_id);
    let title = format!("{}/{}", key.entity_type, key.entity_id);
    let made = async {
        let placement = c.mover.placement(&key).await?;
        let history = c.mover.history(&key).await?;
        let at = match q.at.as_deref().filter(|a| !a.trim().is_empty()) {
            Some(when) => Some((when, c.mover.placement_at(&key, when).await?)),
            None => None,
        };
        let moves = c.mover.moves_of(&key).await?;
        // A shard that does not answer, or an entity too large to count in time, leaves the
        // rest of the page standing.
        let tables = c
            .mover
            .entity_tables(&key, COUNT_WITHIN)
            .await
            .map_err(|e| e.to_string());
        let at = at.as_ref().map(|(when, shard)| (*when, shard.as_deref()));
        Ok(pages::tenant(
            &c.base,
            &key,
            placement.as_ref(),
            at,
            &tables,
            &history,
            &moves,
        ))
    };
    answer(&c, &title, within(made).await)
}

/// The moves list, sent again on every change (the first at once), as server-sent events.
async fn events(State(c): Shared) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let watching = Watching::new();
    let base = c.base.clone();
    let stream = futures_util::stream::unfold(
        (c.live.watch(), watching, true),
        move |(mut rx, watching, first)| {
            let base = base.clone();
            async move {
                if !first && rx.changed().await.is_err() {
                    return None;
                }
                let snapshot = rx.borrow_and_update().clone();
                let html = snapshot.rendered(|s| pages::moves_table(&base, s).into_string());
                let event = Event::default().event("moves").data(html);
                Some((Ok(event), (rx, watching, false)))
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// Batch `batch_id`'s section, sent again whenever it changes in the live snapshot (which holds
/// the open batches and those finished in the last hour), as server-sent events.
async fn batch_events(
    State(c): Shared,
    Path(batch_id): Path<i64>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let watching = Watching::new();
    let (base, actions) = (c.base.clone(), c.actions);
    let stream = futures_util::stream::unfold(
        (c.live.watch(), watching, None::<String>),
        move |(mut rx, watching, mut sent)| {
            let base = base.clone();
            async move {
                loop {
                    let html = {
                        let snapshot = rx.borrow_and_update();
                        let b = snapshot.batches.iter().find(|b| b.batch_id == batch_id);
                        b.map(|b| pages::batch_section(&base, b, actions).into_string())
                    };
                    if let Some(html) = html.filter(|h| sent.as_ref() != Some(h)) {
                        sent = Some(html.clone());
                        let event = Event::default().event("batch").data(html);
                        return Some((Ok(event), (rx, watching, sent)));
                    }
                    rx.changed().await.ok()?;
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// One page watching the moves, counted while its stream is open.
struct Watching;

impl Watching {
    fn new() -> Watching {
        metrics::gauge!("shard_directory_console_watchers").increment(1.0);
        Watching
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        metrics::gauge!("shard_directory_console_watchers").decrement(1.0);
    }
}

async fn prometheus(State(c): Shared) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        c.metrics.render(),
    )
}

async fn css() -> impl IntoResponse {
    let css = include_str!("console.css");
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], css)
}

async fn js() -> impl IntoResponse {
    let js = include_str!("console.js");
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        js,
    )
}

/// With `--token-file`: every request but the login form and the assets is a user's, or 401.
async fn authenticated(State(c): Shared, mut request: Request, next: Next) -> Response {
    let Some(users) = &c.users else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let open =
        path == format!("{}/login", c.base) || path.starts_with(&format!("{}/assets/", c.base));
    match users.of(request.headers()) {
        Some(user) => {
            request.extensions_mut().insert(User(user));
            next.run(request).await
        }
        None if open => next.run(request).await,
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            pages::login(&c.base, Some("Sign in with your console token.")),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

async fn login_form(State(c): Shared) -> Markup {
    pages::login(&c.base, None)
}

/// The login form's POST: the token in a cookie (HttpOnly, SameSite=Strict) under the base path.
async fn login(State(c): Shared, Form(f): Form<Login>) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        format!("Bearer {}", f.token)
            .parse()
            .unwrap_or(header::HeaderValue::from_static("")),
    );
    let known = c.users.as_ref().and_then(|u| u.of(&headers));
    if known.is_none() {
        return (
            StatusCode::UNAUTHORIZED,
            pages::login(&c.base, Some("Unknown token.")),
        )
            .into_response();
    }
    let path = if c.base.is_empty() {
        "/"
    } else {
        c.base.as_str()
    };
    let secure = if c.https { "; Secure" } else { "" };
    let cookie = format!(
        "{}={}; Path={path}; HttpOnly; SameSite=Strict{secure}",
        auth::COOKIE,
        f.token
    );
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to(&format!("{}/", c.base)),
    )
        .into_response()
}

async fn batch(State(c): Shared, Path(batch_id): Path<i64>) -> Response {
    let made = within(c.mover.batch_status(batch_id)).await;
    let made = made.map(|b| pages::batch(&c.base, &b, c.actions));
    answer(&c, &format!("Batch {batch_id}"), made)
}

async fn recorded(State(c): Shared) -> Response {
    let body = if c.actions {
        actions::page(&c.audit.recent())
    } else {
        maud::html! { p.none { "This console is read-only (no --allow-actions)." } }
    };
    answer(&c, "Actions", Ok(body))
}

/// The action named in a path, if it is one `target` takes; a 404 page otherwise.
fn action_of(
    c: &Console,
    name: &str,
    target: &actions::Target,
) -> Result<actions::Action, Box<Response>> {
    actions::Action::parse(name)
        .filter(|a| target.takes(*a))
        .ok_or_else(|| {
            let message = format!("{name}: not an action of {target}");
            let page = pages::error(&c.base, "Action", &message);
            Box::new((StatusCode::NOT_FOUND, page).into_response())
        })
}

fn confirm(c: &Console, user: &User, target: actions::Target, name: &str) -> Response {
    let action = match action_of(c, name, &target) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let csrf = c
        .users
        .as_ref()
        .map(|u| u.csrf(&user.0))
        .unwrap_or_default();
    let title = format!("{} {target}", action.as_str());
    answer(
        c,
        &title,
        Ok(actions::confirm(&c.base, action, &target, &csrf)),
    )
}

async fn confirm_move(
    State(c): Shared,
    Extension(user): Extension<User>,
    Path((id, name)): Path<(i64, String)>,
) -> Response {
    confirm(&c, &user, actions::Target::Move(id), &name)
}

async fn confirm_batch(
    State(c): Shared,
    Extension(user): Extension<User>,
    Path((id, name)): Path<(i64, String)>,
) -> Response {
    confirm(&c, &user, actions::Target::Batch(id), &name)
}

#[derive(Deserialize)]
struct Asked {
    csrf: String,
    confirm: Option<String>,
}

/// A form of this console's, sent by `user` (its CSRF token and origin), and confirmed when
/// `destructive`; else the page that says why not.
fn checked(
    c: &Console,
    user: &User,
    headers: &HeaderMap,
    (csrf, confirm): (&str, Option<&str>),
    destructive: bool,
    what: &str,
) -> Result<(), Box<Response>> {
    let ours = c
        .users
        .as_ref()
        .is_some_and(|u| u.form_is_ours(&user.0, csrf, headers));
    if !ours {
        let message =
            "the form is not this console's (CSRF token or origin): reload the page and ask again";
        let page = pages::error(&c.base, "Action", message);
        return Err(Box::new((StatusCode::FORBIDDEN, page).into_response()));
    }
    if destructive && confirm != Some("yes") {
        let message = format!("{what} needs its confirmation box ticked");
        let page = pages::error(&c.base, "Action", &message);
        return Err(Box::new((StatusCode::BAD_REQUEST, page).into_response()));
    }
    Ok(())
}

/// A confirmation form's POST: checked (CSRF, same origin, confirmed), started, recorded; the
/// answer is the page to follow it on.
fn act(
    c: &Console,
    user: &User,
    headers: &HeaderMap,
    target: actions::Target,
    name: &str,
    asked: Asked,
) -> Response {
    let action = match action_of(c, name, &target) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let what = format!("{} {target}", action.as_str());
    let form = (asked.csrf.as_str(), asked.confirm.as_deref());
    if let Err(refused) = checked(c, user, headers, form, action.destructive(), &what) {
        return *refused;
    }
    actions::start(
        c.mover.clone(),
        c.audit.clone(),
        user.0.clone(),
        action,
        target,
    );
    Redirect::to(&target.page(&c.base)).into_response()
}

async fn act_on_move(
    State(c): Shared,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    Path((id, name)): Path<(i64, String)>,
    Form(asked): Form<Asked>,
) -> Response {
    act(&c, &user, &headers, actions::Target::Move(id), &name, asked)
}

async fn act_on_batch(
    State(c): Shared,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    Path((id, name)): Path<(i64, String)>,
    Form(asked): Form<Asked>,
) -> Response {
    act(
        &c,
        &user,
        &headers,
        actions::Target::Batch(id),
        &name,
        asked,
    )
}

#[derive(Deserialize)]
struct RunAsked {
    csrf: String,
    confirm: Option<String>,
    /// The form's single-use token ([`auth::Users::once`]).
    once: String,
    /// The drawn plan's [`digest`].
    digest: String,
    parallel: Option<usize>,
    per_shard: Option<usize>,
}

/// The most moves at once a run may ask for (the batch keeps them as an `integer`).
const MAX_AT_ONCE: usize = 1000;

/// The run form's POST (its plan's settings in the query, as the fleet page drew it): checked,
/// planned again from the fleet as it is now (as `drain|split|rebalance --apply` plans), refused
/// if that plan is not the one drawn, else recorded as a batch and run; the answer is the
/// batch's page.
async fn run_plan(
    State(c): Shared,
    Extension(user): Extension<User>,
    headers: HeaderMap,
    Query(q): Query<FleetQuery>,
    Form(run): Form<RunAsked>,
) -> Response {
    let page = |status: StatusCode, message: &str| {
        (status, pages::error(&c.base, "Run a plan", message)).into_response()
    };
    let form = (run.csrf.as_str(), run.confirm.as_deref());
    if let Err(refused) = checked(&c, &user, &headers, form, true, "running a plan") {
        return *refused;
    }
    let at_once = |n: Option<usize>, name: &str| match n.unwrap_or(1) {
        n @ 1..=MAX_AT_ONCE => Ok(n),
        n => Err(format!("{name}={n}: from 1 to {MAX_AT_ONCE}")),
    };
    let options = match (
        at_once(run.parallel, "parallel"),
        at_once(run.per_shard, "per_shard"),
    ) {
        (Ok(parallel), Ok(per_shard)) => BatchOptions {
            parallel,
            per_shard,
        },
        (Err(message), _) | (_, Err(message)) => return page(StatusCode::BAD_REQUEST, &message),
    };
    let by = match q.by() {
        Ok(by) => by,
        Err(message) => return page(StatusCode::BAD_REQUEST, &message),
    };
    let fresh = c
        .users
        .as_ref()
        .is_some_and(|u| u.use_once(&user.0, &run.once));
    if !fresh {
        let message = "this form was sent already (or before the console started): draw the \
                       plan again to run it";
        return page(StatusCode::CONFLICT, message);
    }
    let fleet = match within(c.mover.fleet(by == Weigh::Load)).await {
        Ok(f) => f,
        Err(e) => return answer(&c, "Run a plan", Err(e)),
    };
    let plan = match q.plan(&fleet, by) {
        Ok(Some(plan)) => plan,
        Ok(None) => return page(StatusCode::BAD_REQUEST, "no plan asked (plan=)"),
        Err(message) => return page(StatusCode::BAD_REQUEST, &message),
    };
    if plan.moves.is_empty() {
        return page(StatusCode::BAD_REQUEST, "the plan moves nothing");
    }
    if digest(&plan) != run.digest {
        let message = format!(
            "the plan is no longer the one drawn (it now makes {} moves): look at it again \
             before running it",
            plan.moves.len()
        );
        return page(StatusCode::CONFLICT, &message);
    }
    let recorded = actions::run_plan(c.mover.clone(), c.audit.clone(), user.0, plan, options);
    match tokio::time::timeout(PAGE_WITHIN, recorded).await {
        Ok(Ok(Ok(batch_id))) => {
            Redirect::to(&actions::Target::Batch(batch_id).page(&c.base)).into_response()
        }
        Ok(Ok(Err(why))) => page(StatusCode::BAD_GATEWAY, &format!("not run: {why}")),
        Ok(Err(_)) => page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the action's thread ended",
        ),
        Err(_) => answer(&c, "Run a plan", Err(Problem::Slow)),
    }
}
