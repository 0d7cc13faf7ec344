//! The console's pages, rendered on the server (maud escapes every value): they read as plain
//! pages without JavaScript; `console.js` only makes the moves list live and shows times in the
//! viewer's zone (UTC on hover). Every link is under the base path, so that the console works
//! behind a reverse proxy.

use std::collections::BTreeMap;

use maud::{html, Markup, DOCTYPE};
use shard_directory_mover::{
    BatchPlan, BatchState, BatchStatus, Fleet, HistoryRow, MoveRecord, MoveStatus, Phase,
    Placement, TableSize, Weigh,
};
use shard_directory_protocol::EntityKey;

use super::live::Snapshot;

/// The whole page: its title, the navigation, `body`.
pub fn page(base: &str, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · shard_directory" }
                link rel="stylesheet" href={ (base) "/assets/console.css" };
                script src={ (base) "/assets/console.js" } defer {}
            }
            body {
                nav {
                    a href={ (base) "/" } { "Fleet" }
                    a href={ (base) "/moves" } { "Moves" }
                    a href={ (base) "/actions" } { "Actions" }
                    form action={ (base) "/tenant" } method="get" {
                        input name="entity_type" value="tenant" size="8" aria-label="entity type";
                        input name="entity_id" placeholder="entity id" size="12" aria-label="entity id";
                        button { "Find" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// A time as the directory gave it (RFC 3339, UTC): the viewer's zone once the script ran.
fn time(t: &str) -> Markup {
    html! { time datetime=(t) title=(t) { (t) } }
}

fn tenant_link(base: &str, key: &EntityKey) -> Markup {
    html! {
        a href={ (base) "/tenants/" (url(&key.entity_type)) "/" (url(&key.entity_id)) } {
            (key.entity_type) "/" (key.entity_id)
        }
    }
}

/// `s` as one percent-encoded path segment or query value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let (mut value, mut unit) = (n as f64, 0);
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// What a shard holds: its entities' rows, bytes and load summed.
#[derive(Default)]
struct Totals {
    entities: usize,
    rows: i64,
    bytes: i64,
    load: f64,
}

impl Totals {
    fn weight(&self, by: Weigh) -> f64 {
        match by {
            Weigh::Rows => self.rows as f64,
            Weigh::Bytes => self.bytes as f64,
            Weigh::Load => self.load,
        }
    }
}

pub fn weigh_name(by: Weigh) -> &'static str {
    match by {
        Weigh::Rows => "rows",
        Weigh::Bytes => "bytes",
        Weigh::Load => "load",
    }
}

/// The fleet: each shard with its region, entities, rows, bytes, load and open moves, and a bar
/// per shard of its share by `by`.
pub fn fleet(base: &str, fleet: &Fleet, by: Weigh, live: &Snapshot) -> Markup {
    let mut totals: BTreeMap<&str, Totals> = fleet
        .shards
        .iter()
        .map(|s| (s.name.as_str(), Totals::default()))
        .collect();
    for e in &fleet.entities {
        let t = totals.entry(e.shard.as_str()).or_default();
        t.entities += 1;
        t.rows += e.size.rows;
        t.bytes += e.size.bytes;
        t.load += e.size.load;
    }
    let heaviest = totals.values().map(|t| t.weight(by)).fold(0.0, f64::max);
    // Before the first read the count is unknown, not 0.
    let open = |shard: &str| match live.read_at {
        Some(_) => live
            .open()
            .filter(|m| m.source_shard == shard || m.target_shard == shard)
            .count()
            .to_string(),
        None => "?".to_owned(),
    };
    let region = |shard: &str| {
        fleet
            .shards
            .iter()
            .find(|s| s.name == shard)
            .and_then(|s| s.region.clone())
    };
    html! {
        p.by {
            "Bars by "
            @for choice in [Weigh::Bytes, Weigh::Rows, Weigh::Load] {
                @if choice == by { strong { (weigh_name(choice)) } }
                @else { a href={ (base) "/?by=" (weigh_name(choice)) } { (weigh_name(choice)) } }
                " "
            }
        }
        p.note {
            "Entities, rows, bytes and load are those of active entries (what the planners weigh); "
            "an entity being moved is counted among its shards' open moves."
            @for (shard, age) in &fleet.sizes_kept {
                " " (shard) ": rows and bytes as measured " (humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))) " ago."
            }
        }
        (session_notice(live))
        table #shards {
            thead { tr {
                th { "shard" } th { "region" } th { "entities" } th { "rows" } th { "bytes" }
                th { "load (tx/s)" } th { "open moves" } th { "balance by " (weigh_name(by)) }
            } }
            tbody {
                @for (name, t) in &totals {
                    @let share = if heaviest > 0.0 { t.weight(by) / heaviest * 100.0 } else { 0.0 };
                    tr data-shard=(name) {
                        td { (name) }
                        td { (region(name).unwrap_or_default()) }
                        td.n { (t.entities) }
                        td.n { (t.rows) }
                        td.n { (bytes(t.bytes)) }
                        td.n { (format!("{:.1}", t.load)) }
                        td.n { (open(name)) }
                        td.bar { span style={ "width:" (format!("{share:.1}")) "%" } {} }
                    }
                }
            }
        }
    }
}

/// The forms that ask the planners what a drain, a split or a rebalance would move (a GET:
/// nothing is planned for real, nothing runs), and the answer to the one asked: each shard
/// before and after, and the moves.
/// The form that runs a drawn plan (with actions): where it posts, the user's CSRF token, and the
/// plan's digest.
pub struct RunForm {
    pub action: String,
    pub csrf: String,
    /// Good for one run: the form sent twice runs once.
    pub once: String,
    pub digest: String,
}

/// A drawn plan, the CLI command that runs it, and the form that runs it from here (actions).
pub type Asked<'a> = (&'a BatchPlan, String, Option<RunForm>);

pub fn plans(base: &str, fleet: &Fleet, by: Weigh, asked: Option<Asked>) -> Markup {
    let shards: Vec<&str> = fleet.shards.iter().map(|s| s.name.as_str()).collect();
    let by = weigh_name(by);
    html! {
        h2 { "What a plan would change" }
        div.plans {
            form action={ (base) "/" } method="get" {
                input type="hidden" name="by" value=(by);
                input type="hidden" name="plan" value="drain";
                "Drain " (shard_choice("shard", &shards)) " " button { "Plan" }
            }
            form action={ (base) "/" } method="get" {
                input type="hidden" name="by" value=(by);
                input type="hidden" name="plan" value="split";
                "Split " (shard_choice("shard", &shards)) " to " (shard_choice("to", &shards))
                " fraction " input name="fraction" value="0.5" size="4";
                " " button { "Plan" }
            }
            form action={ (base) "/" } method="get" {
                input type="hidden" name="by" value=(by);
                input type="hidden" name="plan" value="rebalance";
                "Rebalance, tolerance " input name="tolerance" value="0.1" size="4";
                " at most " input name="max_moves" value="100" size="4"; " moves "
                button { "Plan" }
            }
        }
        @if let Some((plan, command, run)) = asked {
            (plan_answer(plan, &command, run.as_ref()))
        }
    }
}

fn shard_choice(name: &str, shards: &[&str]) -> Markup {
    html! {
        select name=(name) {
            @for s in shards { option value=(s) { (s) } }
        }
    }
}

fn plan_answer(plan: &BatchPlan, command: &str, run: Option<&RunForm>) -> Markup {
    let by = plan.by;
    let heaviest = plan
        .shards
        .values()
        .flat_map(|t| [t.before.weight(by), t.after.weight(by)])
        .fold(0.0, f64::max);
    let width = |w: f64| {
        let share = if heaviest > 0.0 {
            w / heaviest * 100.0
        } else {
            0.0
        };
        format!("width:{share:.1}%")
    };
    html! {
        section #plan {
            h3 { (plan.purpose) ", by " (weigh_name(by)) ": " (plan.moves.len()) " moves" }
            table {
                thead { tr {
                    th { "shard" } th { "entities before → after" }
                    th { "before" } th { "after" }
                } }
                tbody {
                    @for (name, t) in &plan.shards {
                        tr data-shard=(name) {
                            td { (name) }
                            td.n { (t.entities_before) " → " (t.entities_after) }
                            td.bar { span.before style=(width(t.before.weight(by))) {} }
                            td.bar { span.after style=(width(t.after.weight(by))) {} }
                        }
                    }
                }
            }
            @if !plan.moves.is_empty() {
                table.planned {
                    thead { tr { th { "entity" } th { "from" } th { "to" } th { "rows" } th { "bytes" } } }
                    tbody {
                        @for m in &plan.moves {
                            tr {
                                td { (m.entity_type) "/" (m.entity_id) }
                                td { (m.from) } td { (m.to) }
                                td.n { (m.rows) } td.n { (bytes(m.bytes)) }
                            }
                        }
                    }
                }
            }
            @if !plan.skipped.is_empty() {
                p { (plan.skipped.len()) " entities left where they are: their freeze would outlast --max-freeze." }
            }
            p.hint { "To run it: " code { (command) } }
            @if let Some(run) = run {
                form.run method="post" action=(run.action) {
                    input type="hidden" name="csrf" value=(run.csrf);
                    input type="hidden" name="once" value=(run.once);
                    input type="hidden" name="digest" value=(run.digest);
                    "At once " input name="parallel" value="1" size="3";
                    " (per shard " input name="per_shard" value="1" size="3"; ") "
                    label { input type="checkbox" name="confirm" value="yes" required; " I mean it" }
                    " " button.action { "run this plan" }
                }
            }
        }
    }
}

/// The moves list, live: a section the script refreshes from `/events`.
pub fn moves(base: &str, live: &Snapshot) -> Markup {
    html! {
        section #moves data-events={ (base) "/events" } {
            (moves_table(base, live))
        }
        p { a href={ (base) "/moves?all=1" } { "Every move ever made" } }
    }
}

/// The table of `live`'s moves: what each watcher is sent on each change.
pub fn moves_table(base: &str, live: &Snapshot) -> Markup {
    html! {
        (session_notice(live))
        @if let Some(at) = live.read_at {
            (moves_rows(base, &live.moves, Some(live), "No move is open, and none finished in the last hour."))
            p.read { "Read at " (time(&humantime::format_rfc3339_seconds(at).to_string())) }
        }
    }
}

/// What the live session's state makes of the moves a page shows: the last read while the
/// session is down, nothing before the first read. Neither is "no move is open".
fn session_notice(live: &Snapshot) -> Markup {
    html! {
        @if let Some(error) = &live.error {
            p.error { "The console's directory session is down: " (error) ". Showing the last read." }
        }
        @if live.read_at.is_none() {
            p.none { "The moves have not been read yet." }
        }
    }
}

/// Moves, one row each; `none` when there are none. With `live` (the moves list), each open
/// move's slot lag and retained WAL as last read, and how long a freeze held now has lasted.
pub fn moves_rows(base: &str, moves: &[MoveRecord], live: Option<&Snapshot>, none: &str) -> Markup {
    let no_slots = BTreeMap::new();
    let slots = live.map_or(&no_slots, |l| &l.slots);
    let read_at = live.and_then(|l| l.read_at);
    html! {
        @if moves.is_empty() {
            p.none { (none) }
        } @else {
            table.moves {
                thead { tr {
                    th { "move" } th { "entity" } th { "from" } th { "to" } th { "method" }
                    th { "phase" } th { "progress" } th { "rate" } th { "ETA" }
                    th { "lag" } th { "retained WAL" } th { "freeze" }
                    th { "started" } th { "last error" }
                } }
                tbody {
                    @for m in moves {
                        @let (done, of) = progress(m);
                        @let slot = slots.get(&m.move_id);
                        tr data-move=(m.move_id) data-phase=(m.phase.as_str()) {
                            td { a href={ (base) "/moves/" (m.move_id) } { (m.move_id) } }
                            td { (tenant_link(base, &m.entity())) }
                            td { (m.source_shard) }
                            td { (m.target_shard) }
                            td { (m.method.as_str()) }
                            td.phase { (m.phase.as_str()) }
                            td { progress value=(done) max=(of.max(1)) {} " " (done) " / " (of) }
                            td.n { (rate(m)) }
                            td.n { (eta(m)) }
                            td.n.lag { (slot.and_then(|s| s.lag_bytes).map(bytes).unwrap_or_default()) }
                            td.n.retained { (slot.map(|s| bytes(s.retained_wal_bytes)).unwrap_or_default()) }
                            td.n.freeze { (freeze(m, read_at)) }
                            td { (time(&m.started_at)) }
                            td.error { (m.last_error.clone().unwrap_or_default()) }
                        }
                    }
                }
            }
        }
    }
}

/// A freeze held now, and for how long at `read_at`; else the longest the move held.
fn freeze(m: &MoveRecord, read_at: Option<std::time::SystemTime>) -> String {
    let held = matches!(m.phase, Phase::Frozen | Phase::Verified);
    let since = m
        .freeze_started_at
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339(t).ok());
    match (held, since, read_at) {
        (true, Some(since), Some(at)) => {
            let ms = at.duration_since(since).unwrap_or_default().as_millis();
            format!("frozen {ms} ms")
        }
        _ => m
            .max_freeze_seen_ms
            .map(|ms| format!("longest {ms} ms"))
            .unwrap_or_default(),
    }
}

/// Rows copied (or deleted, once the cutover is past) of the rows to carry.
fn progress(m: &MoveRecord) -> (i64, i64) {
    let of: i64 = m.tables.values().map(|t| t.rows).sum();
    let done: i64 = m.tables.values().map(|t| t.copied.max(t.deleted)).sum();
    (done.min(of), of)
}

fn rate(m: &MoveRecord) -> String {
    let r: i64 = m.tables.values().filter_map(|t| t.rows_per_second).sum();
    if r > 0 {
        format!("{r} rows/s")
    } else {
        String::new()
    }
}

fn eta(m: &MoveRecord) -> String {
    m.tables
        .values()
        .filter_map(|t| t.eta_seconds)
        .max()
        .map(|s| format!("{s} s"))
        .unwrap_or_default()
}

/// The actions a move in `phase` takes (with `--allow-actions`): links to their confirmation.
fn move_actions(base: &str, m: &MoveRecord) -> Markup {
    let phase = m.phase;
    let mut offered = Vec::new();
    if phase.can_abort() && !phase.is_finished() {
        offered.push("abort");
    }
    if !phase.is_finished() && phase != Phase::Reversible {
        offered.push("resume");
    }
    if phase == Phase::Reversible {
        offered.extend(["revert", "finalize"]);
    }
    html! {
        @if !offered.is_empty() {
            p.actions {
                @for a in offered {
                    a.action href={ (base) "/moves/" (m.move_id) "/" (a) } { (a) } " "
                }
            }
        }
    }
}

/// One move: its record, per table, the process driving it and its slot; with `actions`, what
/// may be asked of it.
pub fn move_detail(base: &str, s: &MoveStatus, actions: bool) -> Markup {
    let m = &s.record;
    html! {
        @if actions { (move_actions(base, m)) }
        dl {
            dt { "entity" } dd { (tenant_link(base, &m.entity())) }
            dt { "from → to" } dd { (m.source_shard) " → " (m.target_shard) }
            dt { "method" } dd { (m.method.as_str()) @if m.reversible { " (reversible)" } }
            dt { "phase" } dd.phase { (m.phase.as_str()) }
            dt { "started" } dd { (time(&m.started_at)) " by " (m.started_by) }
            @if let Some(f) = &m.finished_at { dt { "finished" } dd { (time(f)) } }
            dt { "max freeze" } dd { (m.max_freeze_ms) " ms" }
            @if let Some(ms) = m.max_freeze_seen_ms { dt { "longest freeze" } dd { (ms) " ms" } }
            @if let Some(v) = m.cutover_version { dt { "cutover version" } dd { (v) } }
            dt { "driven by" } dd {
                @match &s.driver { Some(d) => (d.to_string()), None => "no process" }
            }
            @if let Some(slot) = &s.slot {
                dt { "slot" } dd {
                    (slot.name) " on " (slot.shard) ": keeps " (bytes(slot.retained_wal_bytes))
                    " of WAL"
                    @if let Some(lag) = slot.lag_bytes { ", " (bytes(lag)) " behind" }
                    @if !slot.active { " (not streaming)" }
                }
            }
            @if let Some(e) = &m.last_error { dt { "last error" } dd.error { (e) } }
        }
        h2 { "Tables" }
        table.tables {
            thead { tr {
                th { "table" } th { "rows" } th { "copied" } th { "verified" } th { "deleted" }
                th { "rate" } th { "ETA" }
            } }
            tbody {
                @for (name, t) in &m.tables {
                    tr {
                        td { (name) } td.n { (t.rows) } td.n { (t.copied) }
                        td.n { (t.verified.map(|v| v.to_string()).unwrap_or_default()) }
                        td.n { (t.deleted) }
                        td.n { (t.rows_per_second.map(|r| format!("{r} rows/s")).unwrap_or_default()) }
                        td.n { (t.eta_seconds.map(|s| format!("{s} s")).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

/// What the tenant page says of the tenant's rows: its shard and each table's rows and bytes
/// there, none without an entry, or why they could not be counted.
pub type Tables = Result<Option<(String, Vec<TableSize>)>, String>;

/// A tenant: where it is, where it was at `at` (when asked), its rows and bytes per table on its
/// shard, its history and its moves.
pub fn tenant(
    base: &str,
    key: &EntityKey,
    placement: Option<&Placement>,
    at: Option<(&str, Option<&str>)>,
    tables: &Tables,
    history: &[HistoryRow],
    moves: &[MoveRecord],
) -> Markup {
    html! {
        @match placement {
            Some(p) => p.now {
                "On " strong { (p.shard_name) } ", " (p.state.as_str())
                @if let Some(t) = &p.target_shard { ", moving to " (t) }
                " (entry version " (p.version) ")"
            },
            None => p.none { "The directory has no entry for it." },
        }
        form.at action={ (base) "/tenants/" (url(&key.entity_type)) "/" (url(&key.entity_id)) } method="get" {
            label { "Where was it at " input type="text" name="at" placeholder="2026-03-01 12:00Z" value=(at.map(|a| a.0).unwrap_or_default()); }
            button { "Show" }
        }
        @if let Some((when, shard)) = at {
            p.at { "At " (when) ": " @match shard { Some(s) => strong { (s) }, None => "no entry" } }
        }
        @match tables {
            Ok(Some((shard, sizes))) => {
                h2 { "Rows on " (shard) }
                table #tables {
                    thead { tr { th { "table" } th { "rows" } th { "bytes" } } }
                    tbody {
                        @for t in sizes {
                            tr data-table=(t.table) {
                                td { (t.table) }
                                td.n.rows data-rows=(t.rows) { (t.rows) }
                                td.n.bytes data-bytes=(t.bytes) { (bytes(t.bytes)) }
                            }
                        }
                    }
                }
            }
            Ok(None) => {}
            Err(why) => { h2 { "Rows" } p.error { "Its rows could not be counted: " (why) } }
        }
        h2 { "History" }
        ol.timeline {
            @for h in history {
                li {
                    (time(&h.changed_at)) " " (h.transition) " "
                    (h.old_shard.clone().unwrap_or_default()) " → "
                    (h.new_shard.clone().unwrap_or_default())
                    @if let Some(s) = &h.new_state { " (" (s) ")" }
                    " at version " (h.version) " by " (h.changed_by)
                }
            }
        }
        h2 { "Moves" }
        (moves_rows(base, moves, None, "It was never moved."))
    }
}

/// A batch's page: its section, which the script keeps live from the batch's events.
pub fn batch(base: &str, b: &BatchStatus, actions: bool) -> Markup {
    html! {
        section #batch data-events={ (base) "/batches/" (b.batch_id) "/events" } data-event="batch" {
            (batch_section(base, b, actions))
        }
    }
}

/// A batch: its plan's purpose, state and each planned move's phase; with `actions`, what may
/// be asked of it. What a batch's watchers are sent on each change.
pub fn batch_section(base: &str, b: &BatchStatus, actions: bool) -> Markup {
    let offered: &[&str] = match b.state {
        BatchState::Running => &["pause", "abort"],
        BatchState::Paused => &["resume", "abort"],
        _ => &[],
    };
    html! {
        @if actions && !offered.is_empty() {
            p.actions {
                @for a in offered {
                    a.action href={ (base) "/batches/" (b.batch_id) "/" (a) } { (a) } " "
                }
            }
        }
        dl data-state=(b.state.as_str()) {
            dt { "plan" } dd { (b.purpose) }
            dt { "state" } dd.state { (b.state.as_str()) }
            dt { "at once" } dd { (b.parallel) " (" (b.per_shard) " per shard)" }
            dt { "started" } dd { (time(&b.started_at)) " by " (b.started_by) }
        }
        table.batch {
            thead { tr { th { "entity" } th { "from" } th { "to" } th { "move" } th { "phase" } } }
            tbody {
                @for m in &b.moves {
                    tr data-entity={ (m.planned.entity_type) "/" (m.planned.entity_id) } data-phase=(m.phase) {
                        td { (m.planned.entity_type) "/" (m.planned.entity_id) }
                        td { (m.planned.from) } td { (m.planned.to) }
                        td { @if let Some(id) = m.move_id { a href={ (base) "/moves/" (id) } { (id) } } }
                        td { (m.phase) }
                    }
                }
            }
        }
    }
}

/// The login form (with `--token-file`): the token goes into a cookie of this console's.
pub fn login(base: &str, message: Option<&str>) -> Markup {
    page(
        base,
        "Sign in",
        html! {
            @if let Some(m) = message { p.error { (m) } }
            form method="post" action={ (base) "/login" } {
                label { "Token " input type="password" name="token" autocomplete="current-password" required; }
                " " button { "Sign in" }
            }
        },
    )
}

/// A page for an error: what went wrong, in the server's words.
pub fn error(base: &str, title: &str, message: &str) -> Markup {
    page(base, title, html! { p.error { (message) } })
}
