//! What `start` checks before it changes anything: the entry, both shards in the registry, the
//! method the source allows, the entity's tables on both sides (columns, types, replica
//! identity), the target's triggers a copy would skip, no rows of the entity on the target yet,
//! fences a move can start from. Each refusal names the table or shard and the fix.

pub(crate) mod coverage;
pub(crate) mod integrity;
pub(crate) mod privileges;

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use shard_directory_protocol::{EntityKey, State};
use tokio_postgres::Client;

use crate::directory::entry::{self, Placement};
use crate::directory::record::Method;
use crate::directory::registry::{self, Overrides};
use crate::error::{At, Error, Place, Step};
use crate::options::{MethodChoice, MoveOptions};
use crate::preflight::privileges::End;
use crate::run::cleanup::purge;
use crate::run::copy::triggers;
use crate::run::cutover::sequences;
use crate::shards::catalog::{self, EntityTable};
use crate::shards::fence::{self, Fence};
use crate::shards::side::Side;

/// What a move would do, as preflight found it (`--dry-run`).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub entity: EntityKey,
    pub source: String,
    pub target: String,
    pub method: Method,
    /// Each table of the entity (parents first) and its rows of the entity on the source.
    pub tables: Vec<(String, i64)>,
    pub source_fence: Fence,
    pub target_fence: Fence,
    /// What will make the move slower than it need be, with the fix; it goes ahead.
    pub warnings: Vec<String>,
    /// How long its comparison and its freeze should take (`--dry-run` only).
    pub estimates: Vec<String>,
}

impl Plan {
    /// Adds what a comparison of every row takes (`full_check`, measured on a sample) and what
    /// that means for the freeze under `options`; a freeze that would outrun `--max-freeze` is a
    /// warning.
    pub(crate) fn estimate(&mut self, full_check: Duration, options: &MoveOptions) {
        let max = options.max_freeze;
        self.estimates.push(format!(
            "comparing every row: about {} (each table's first rows hashed on {})",
            seconds(full_check),
            self.source
        ));
        let (freeze, over) = match self.method {
            Method::Logical if options.online_check => (
                format!(
                    "the freeze: a catch-up and the rows changed since the online check, whatever \
                     the size; measured before freezing, and not begun while over half of \
                     --max-freeze ({})",
                    seconds(max)
                ),
                None,
            ),
            Method::Logical => (
                format!(
                    "the freeze: about {}, every row compared under it (--no-online-check)",
                    seconds(full_check)
                ),
                Some("drop --no-online-check"),
            ),
            Method::Copy => (
                format!(
                    "the freeze: more than {}, the copy and the comparison of every row under it",
                    seconds(full_check)
                ),
                Some("use --method logical, or raise --max-freeze"),
            ),
        };
        self.estimates.push(freeze);
        if let Some(fix) = over.filter(|_| full_check > max) {
            self.warnings.push(format!(
                "the freeze would outlast --max-freeze ({}): it would be undone and the move \
                 would fail; fix: {fix}",
                seconds(max)
            ));
        }
    }
}

fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "move {} from {} to {} by {} copy",
            self.entity,
            self.source,
            self.target,
            self.method.as_str()
        )?;
        for (table, rows) in &self.tables {
            writeln!(f, "  {table}: {rows} rows")?;
        }
        writeln!(
            f,
            "  fences now: source {}, target {}",
            self.source_fence, self.target_fence
        )?;
        for estimate in &self.estimates {
            writeln!(f, "  estimate: {estimate}")?;
        }
        for warning in &self.warnings {
            writeln!(f, "  warning: {warning}")?;
        }
        let steps = match self.method {
            Method::Logical => {
                "begin_move; publication + subscription (copy, then stream); wait for a small lag; \
                 track changes on both shards and compare every row; freeze; catch up; compare \
                 the rows changed since; sequences; fence target; complete_move; fence source; \
                 drop replication; delete source rows"
            }
            Method::Copy => {
                "begin_move; freeze; copy; verify; sequences; fence target; complete_move; \
                 fence source; delete source rows"
            }
        };
        write!(f, "  steps: {steps}")
    }
}

/// What `start` checks before it changes anything, in order. Returns the plan, the entity's
/// tables (parents first) and connections to both shards.
pub(crate) async fn preflight(
    directory: &Client,
    overrides: &Overrides,
    options: &MoveOptions,
    key: &EntityKey,
    target_name: &str,
) -> Result<(Plan, Vec<EntityTable>, Side, Side), Error> {
    let missing = privileges::missing_on_directory(directory)
        .await
        .at(Step::Preflight, Place::Directory)?;
    require_privileges("the directory", missing)?;
    not_reversible(directory, key).await?;
    let entry = movable_entry(directory, key, target_name).await?;
    let source = connect(directory, overrides, &entry.shard_name).await?;
    let target = connect(directory, overrides, target_name).await?;
    for side in [&source, &target] {
        let missing = privileges::schema_usage(&side.client)
            .await
            .at(Step::Preflight, side.name())?;
        require_privileges(&format!("shard {}", side.name()), missing)?;
    }
    let tables = protected_tables(&source, &key.entity_type).await?;
    let method = method(&source, &target, &tables, options).await?;
    matches_on_target(&source, &target, &tables, &key.entity_type, method).await?;
    for side in [&source, &target] {
        for t in &tables {
            canonical_on(&side.client, side.name(), t, key).await?;
        }
    }
    let (s, g) = (source.name(), target.name());
    coverage::check(
        &source.client,
        s,
        &key.entity_type,
        &options.unrelated_tables,
    )
    .await?;
    sequences::check_target((&source.client, s), (&target.client, g), &tables).await?;
    if method == Method::Copy || options.throttle().paces() {
        // The mover's own copy writes the rows (the logical method's, when paced).
        triggers::copy_as_replica(&target.client, g, &tables, Step::Preflight).await?;
    }
    integrity::check_crossings(&source.client, s, &tables, key, Step::Preflight).await?;
    no_rows_on_target(&target, &tables, key).await?;
    let (source_fence, target_fence) = startable_fences(&source, &target, key).await?;
    if options.reversible {
        way_back_possible(&source, &target, key, options).await?;
    }
    let plan = Plan {
        entity: key.clone(),
        source: s.to_owned(),
        target: g.to_owned(),
        method,
        tables: rows_on_source(&source, &tables, key).await?,
        source_fence,
        target_fence,
        warnings: unindexed_keys(&tables),
        estimates: Vec::new(),
    };
    Ok((plan, tables, source, target))
}

/// `--reversible`: the way back replicates the entity's rows from the target to the source, so
/// the logical method's needs hold the other way round (the target's `wal_level`, its replica
/// identities, the role's privileges to publish there and subscribe on the source).
async fn way_back_possible(
    source: &Side,
    target: &Side,
    key: &EntityKey,
    options: &MoveOptions,
) -> Result<(), Error> {
    let on_target = protected_tables(target, &key.entity_type).await?;
    let logical = MoveOptions {
        method: MethodChoice::Logical,
        ..options.clone()
    };
    let checked = async {
        method(target, source, &on_target, &logical).await?;
        matches_on_target(
            target,
            source,
            &on_target,
            &key.entity_type,
            Method::Logical,
        )
        .await
    };
    checked.await.map_err(|e| match e {
        Error::Preflight { problem, fix } => Error::Preflight {
            problem: format!(
                "--reversible needs a way back, a logical replication from {} to {}: {problem}",
                target.name(),
                source.name()
            ),
            fix: format!("{fix}; or move without --reversible"),
        },
        other => other,
    })
}

/// What a revert of reversible move `reversible` checks before it changes anything: the move is
/// reversible, the entity active on its target, the way back there and on, the fences as the
/// move left them. The revert's source is the move's target and its target the move's source.
pub(crate) async fn revert(
    directory: &Client,
    overrides: &Overrides,
    reversible: &crate::directory::record::MoveRecord,
) -> Result<(Plan, Vec<EntityTable>, Side, Side), Error> {
    let missing = privileges::missing_on_directory(directory)
        .await
        .at(Step::Preflight, Place::Directory)?;
    require_privileges("the directory", missing)?;
    let (id, key) = (reversible.move_id, reversible.entity());
    if reversible.phase != crate::directory::phase::Phase::Reversible {
        return refuse(
            format!("move {id} of {key} is {}, not reversible", reversible.phase),
            "only a move made with --reversible, neither finalized nor reverted, can be              reverted; move the entity back with `shard-directory move`"
                .into(),
        );
    }
    let (back_from, back_to) = (&reversible.target_shard, &reversible.source_shard);
    let entry = movable_entry(directory, &key, back_to).await?;
    if &entry.shard_name != back_from {
        return refuse(
            format!(
                "{key} is on {}, not on {back_from} where move {id} put it",
                entry.shard_name
            ),
            "someone changed the directory entry by hand; check where its rows are".into(),
        );
    }
    let source = connect(directory, overrides, back_from).await?;
    let target = connect(directory, overrides, back_to).await?;
    let tables = protected_tables(&source, &key.entity_type).await?;
    let logical = MoveOptions {
        method: MethodChoice::Logical,
        ..MoveOptions::default()
    };
    method(&source, &target, &tables, &logical).await?;
    matches_on_target(&source, &target, &tables, &key.entity_type, Method::Logical).await?;
    let name = crate::run::replication::logical::way_back_name(id);
    let state = crate::run::replication::logical::sync_state(&target.client, &name)
        .await
        .at(Step::Preflight, target.name())?;
    if !state.exists {
        return refuse(
            format!(
                "the way back of move {id} (subscription {name} on shard {}) is gone",
                target.name()
            ),
            format!(
                "without it the rows on {back_to} are stale; `shard-directory finalize {id}`                  clears them, then move the entity with `shard-directory move`"
            ),
        );
    }
    let source_fence = fence::read(&source.client, &key)
        .await
        .at(Step::Preflight, source.name())?;
    let target_fence = fence::read(&target.client, &key)
        .await
        .at(Step::Preflight, target.name())?;
    let as_left = matches!(source_fence, Fence::Owned { .. })
        && matches!(&target_fence, Fence::Moved { moved_to, .. } if moved_to == back_from);
    if !as_left {
        return refuse(
            format!(
                "{key} is fenced {source_fence} on {back_from} and {target_fence} on {back_to},                  not as move {id} left it (owned, and moved to {back_from})"
            ),
            "someone changed a fence by hand; check where its rows are".into(),
        );
    }
    let plan = Plan {
        entity: key.clone(),
        source: back_from.clone(),
        target: back_to.clone(),
        method: Method::Logical,
        tables: rows_on_source(&source, &tables, &key).await?,
        source_fence,
        target_fence,
        warnings: unindexed_keys(&tables),
        estimates: Vec::new(),
    };
    Ok((plan, tables, source, target))
}

/// A warning per table whose key column leads no index, naming the index to create.
fn unindexed_keys(tables: &[EntityTable]) -> Vec<String> {
    tables
        .iter()
        .filter(|t| !t.key_indexed)
        .map(|t| {
            format!(
                "no index of {} leads with {}: every check of the entity's rows, and every batch \
                 of their delete, reads the whole table; fix: CREATE INDEX ON {} ({})",
                t.name, t.key_column, t.quoted, t.key_quoted
            )
        })
        .collect()
}

/// A refusal: what is wrong and how to fix it.
fn refuse<T>(problem: String, fix: String) -> Result<T, Error> {
    Err(Error::Preflight { problem, fix })
}

/// Refuses when the mover's role lacks privileges on `place` (`missing`, each with its GRANT).
fn require_privileges(place: &str, missing: Vec<String>) -> Result<(), Error> {
    if missing.is_empty() {
        return Ok(());
    }
    refuse(
        format!(
            "the mover's role lacks privileges on {place} ({} missing)",
            missing.len()
        ),
        missing.join("; "),
    )
}

/// Refuses while the entity has a reversible move: its rows still stream back to that move's
/// source, and only `finalize` or `revert` end that.
pub(crate) async fn not_reversible(directory: &Client, key: &EntityKey) -> Result<(), Error> {
    let Some(id) = crate::directory::record::reversible_of(directory, key, None)
        .await
        .at(Step::Preflight, Place::Directory)?
    else {
        return Ok(());
    };
    refuse(
        format!("move {id} of {key} is reversible: its rows still stream back to its source"),
        format!(
            "`shard-directory finalize {id}` keeps it where it is; `shard-directory revert {id}`              takes it back; then move it"
        ),
    )
}

/// The entity's entry, when a move can start from it: active, and not on the target already.
async fn movable_entry(
    directory: &Client,
    key: &EntityKey,
    target_name: &str,
) -> Result<Placement, Error> {
    let Some(entry) = entry::read(directory, key)
        .await
        .at(Step::Preflight, Place::Directory)?
    else {
        return refuse(
            format!("no directory entry for {key}"),
            "insert it into shard_directory.shard_directory first".into(),
        );
    };
    if entry.state != State::Active {
        return refuse(
            format!(
                "{key} is {} on {} (target {}): a move is already under way",
                entry.state,
                entry.shard_name,
                entry.target_shard.as_deref().unwrap_or("none")
            ),
            "`shard-directory list` shows open moves: resume or abort that one".into(),
        );
    }
    if entry.shard_name == target_name {
        return refuse(
            format!("{key} is already on {target_name}"),
            "choose another target shard".into(),
        );
    }
    Ok(entry)
}

/// A connection to registered shard `shard`.
async fn connect(directory: &Client, overrides: &Overrides, shard: &str) -> Result<Side, Error> {
    Side::connect(registry::endpoint(directory, overrides, shard).await?, None).await
}

/// The tables the source protects for entity type `kind` (parents first); refuses when there
/// are none.
async fn protected_tables(source: &Side, kind: &str) -> Result<Vec<EntityTable>, Error> {
    let s = source.name();
    let tables = catalog::describe(&source.client, kind)
        .await
        .at(Step::Preflight, s)?;
    if tables.is_empty() {
        return refuse(
            format!(
                "no table on source shard {s} is protected for entity type '{kind}': \
                 nothing says where its rows are"
            ),
            format!(
                "SELECT shard_directory.protect('<table>', '<key column>', '{kind}') for each \
                 table of the entity, on every shard"
            ),
        );
    }
    Ok(tables)
}

/// Why the logical method cannot move the entity's rows out of `shard` (the problem and its fix):
/// its `wal_level`, or a key type PostgreSQL's row filters do not accept; `None` when it can.
pub(crate) async fn logical_blocker(
    (client, s): (&Client, &str),
    tables: &[EntityTable],
) -> Result<Option<(String, String)>, Error> {
    let wal_level: String = client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .at(Step::Preflight, s)?
        .get(0);
    if wal_level != "logical" {
        return Ok(Some((
            format!(
                "source shard {s} has wal_level = {wal_level}; the logical method needs logical"
            ),
            format!(
                "ALTER SYSTEM SET wal_level = logical and restart shard {s} (it also needs \
                 free replication slots and WAL senders), or use --method copy"
            ),
        )));
    }
    Ok(tables.iter().find(|t| !t.key_builtin).map(|t| {
        (
            format!(
                "key column {}.{} has type {}, which is not built in: PostgreSQL's publication \
                 row filters accept built-in types only, so the logical method cannot select \
                 the entity's rows",
                t.name, t.key_column, t.key_type
            ),
            "use --method copy (or auto, which chooses it)".to_owned(),
        )
    }))
}

/// The method the move can use, as `options.method` asks: `logical` needs the source's
/// `wal_level = logical` and built-in key types; `auto` chooses `copy` when logical cannot be
/// used or the role may not publish or subscribe. Refuses when the role lacks what the method
/// needs on either shard.
async fn method(
    source: &Side,
    target: &Side,
    tables: &[EntityTable],
    options: &MoveOptions,
) -> Result<Method, Error> {
    let logical_blocker = logical_blocker((&source.client, source.name()), tables).await?;
    let mut method = match (options.method, logical_blocker) {
        (MethodChoice::Copy, _) | (MethodChoice::Auto, Some(_)) => Method::Copy,
        (MethodChoice::Auto | MethodChoice::Logical, None) => Method::Logical,
        (MethodChoice::Logical, Some((problem, fix))) => return refuse(problem, fix),
    };
    let subscriber = End::Target {
        publisher: &source.endpoint.replication_conninfo,
        publisher_name: source.name(),
    };
    for (side, end) in [(source, End::Source), (target, subscriber)] {
        let mut missing = privileges::missing_on_shard(&side.client, tables, method, end)
            .await
            .at(Step::Preflight, side.name())?;
        if !missing.is_empty() && method == Method::Logical && options.method == MethodChoice::Auto
        {
            let copy = privileges::missing_on_shard(&side.client, tables, Method::Copy, end);
            let copy = copy.await.at(Step::Preflight, side.name())?;
            if copy.is_empty() {
                method = Method::Copy;
            }
            missing = copy;
        }
        require_privileges(&format!("shard {}", side.name()), missing)?;
    }
    Ok(method)
}

/// Each of the entity's tables is on the target, protected with the same key column, with every
/// column of the source's of the same type; for `logical`, the source's replica identity of
/// each includes the key column.
async fn matches_on_target(
    source: &Side,
    target: &Side,
    tables: &[EntityTable],
    kind: &str,
    method: Method,
) -> Result<(), Error> {
    let (s, g) = (source.name(), target.name());
    let on_target = catalog::describe(&target.client, kind)
        .await
        .at(Step::Preflight, g)?;
    for t in tables {
        let (name, key_column) = (&t.name, &t.key_column);
        let protect = format!("SELECT shard_directory.protect('{name}', '{key_column}', '{kind}')");
        let Some(there) = on_target.iter().find(|x| x.name == t.name) else {
            return if catalog::exists(&target.client, &t.quoted)
                .await
                .at(Step::Preflight, g)?
            {
                refuse(
                    format!(
                        "table {name} exists on target shard {g} but is not protected for \
                         entity type '{kind}'"
                    ),
                    format!("{protect} on shard {g}"),
                )
            } else {
                refuse(
                    format!("table {name} is missing on target shard {g}"),
                    format!(
                        "create it on shard {g} with the same columns as on {s}, then {protect} there"
                    ),
                )
            };
        };
        if there.key_column != t.key_column {
            return refuse(
                format!(
                    "table {name} is protected with key column {} on target shard {g} but \
                     {key_column} on source shard {s}",
                    there.key_column
                ),
                "protect it with the same key column on both shards".into(),
            );
        }
        for c in &t.columns {
            match there.columns.iter().find(|x| x.name == c.name) {
                None => {
                    return refuse(
                        format!(
                            "column {}.{} ({}) is missing on target shard {g}",
                            name, c.name, c.type_name
                        ),
                        format!(
                            "ALTER TABLE {name} ADD COLUMN {} {} on shard {g}",
                            c.quoted, c.type_name
                        ),
                    )
                }
                Some(x) if x.type_name != c.type_name => {
                    return refuse(
                        format!(
                            "column {}.{} is {} on target shard {g} but {} on source shard {s}",
                            name, c.name, x.type_name, c.type_name
                        ),
                        "give it the same type on both shards".into(),
                    )
                }
                Some(_) => {}
            }
        }
        if method == Method::Logical && !t.identity_gaps.is_empty() {
            let gaps: Vec<&str> = t.identity_gaps.iter().map(|g| g.name.as_str()).collect();
            let fixes: Vec<String> = t
                .identity_gaps
                .iter()
                .map(|g| match &g.usable_index {
                    Some(index) => format!(
                        "ALTER TABLE {} REPLICA IDENTITY USING INDEX {index}",
                        g.name
                    ),
                    None => format!("ALTER TABLE {} REPLICA IDENTITY FULL", g.name),
                })
                .collect();
            return refuse(
                format!(
                    "table {name} on source shard {s}: the replica identity of {} does not \
                     include the key column {key_column}, so once a publication filters on it \
                     PostgreSQL would refuse every UPDATE and DELETE there, for every entity",
                    gaps.join(", ")
                ),
                format!(
                    "{} on shard {s} (a unique index that includes {key_column} where there is \
                     one); or use --method copy",
                    fixes.join("; ")
                ),
            );
        }
    }
    Ok(())
}

/// Refuses when the target already holds rows of the entity.
async fn no_rows_on_target(
    target: &Side,
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<(), Error> {
    let g = target.name();
    let Some(table) = purge::first_table_with_rows(&target.client, tables, key)
        .await
        .at(Step::Preflight, g)?
    else {
        return Ok(());
    };
    refuse(
        format!("target shard {g} already has rows of {key} in table {table}"),
        format!(
            "delete them first (a move with --keep-source leaves rows behind; \
             `shard-directory history {} {}` shows where the entity has been), or \
             choose another target",
            key.entity_type, key.entity_id
        ),
    )
}

/// The entity's fences on both sides, when a move can start from them: none or owned on the
/// source, none or moved on the target.
async fn startable_fences(
    source: &Side,
    target: &Side,
    key: &EntityKey,
) -> Result<(Fence, Fence), Error> {
    let (s, g, kind) = (source.name(), target.name(), &key.entity_type);
    let source_fence = fence::read(&source.client, key)
        .await
        .at(Step::Preflight, s)?;
    if !matches!(source_fence, Fence::None | Fence::Owned { .. }) {
        return refuse(
            format!("{key} is fenced {source_fence} on source shard {s}"),
            format!(
                "an unfinished move? `shard-directory list` shows open moves; if nothing is \
                 moving it, SELECT shard_directory.unfence('{kind}', '{}') on shard {s}",
                key.entity_id
            ),
        );
    }
    let target_fence = fence::read(&target.client, key)
        .await
        .at(Step::Preflight, g)?;
    if !matches!(target_fence, Fence::None | Fence::Moved { .. }) {
        return refuse(
            format!(
                "{key} is fenced {target_fence} on target shard {g}: that shard believes it \
                 holds the entity"
            ),
            format!(
                "check where its rows are; if not on {g}, SELECT shard_directory.unfence('{kind}', '{}') there",
                key.entity_id
            ),
        );
    }
    Ok((source_fence, target_fence))
}

/// Each table of the entity and its rows of the entity on the source.
async fn rows_on_source(
    source: &Side,
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<Vec<(String, i64)>, Error> {
    let mut rows = Vec::new();
    for t in tables {
        let n: i64 = source
            .client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE {}",
                    t.quoted,
                    t.entity_predicate()
                ),
                &[&key.entity_id],
            )
            .await
            .at(Step::Preflight, source.name())?
            .get(0);
        rows.push((t.name.clone(), n));
    }
    Ok(rows)
}

/// Refuses unless the entity's id is canonical for `t`'s key column on `shard`, as the shard's own
/// rule reads it (`canonical_entity_id`): the mover selects rows by SQL equality, the shard's
/// check by the key's text, and the two agree only on a canonical id of a key type that can key
/// an entity. `08842` for a bigint key would move the rows of `8842` and fence `08842`, which no
/// row's key matches.
pub(crate) async fn canonical_on(
    client: &Client,
    shard: &str,
    t: &EntityTable,
    key: &EntityKey,
) -> Result<(), Error> {
    let id = &key.entity_id;
    let canonical: String = match client
        .query_one(
            "SELECT shard_directory.canonical_entity_id($1::text::regclass, $2)",
            &[&t.quoted, id],
        )
        .await
    {
        Ok(row) => row.get(0),
        Err(e) if e.as_db_error().is_none() => {
            return Err(Error::Db {
                step: Step::Preflight,
                place: Place::Shard(shard.to_owned()),
                source: e,
            })
        }
        Err(e) => {
            let db = e.as_db_error().expect("a server error");
            let (message, hint) = (db.message().to_owned(), db.hint().map(str::to_owned));
            return Err(Error::Preflight {
                problem: format!(
                    "{key} cannot be moved by table {} on shard {shard}: {message}",
                    t.name
                ),
                fix: hint.unwrap_or_else(|| {
                    format!(
                        "the entity id must be a value of the key column {}.{} ({})",
                        t.name, t.key_column, t.key_type
                    )
                }),
            });
        }
    };
    if &canonical == id {
        return Ok(());
    }
    Err(Error::Preflight {
        problem: format!(
            "entity id \"{id}\" of {key} is not canonical for key column {}.{} ({}) on shard \
             {shard}, which reads it as \"{canonical}\": the rows would move but the fences would \
             name an id no row's key matches",
            t.name, t.key_column, t.key_type
        ),
        fix: format!(
            "use the canonical id \"{canonical}\" in the directory (delete the entry and insert \
             it again with that id)"
        ),
    })
}
