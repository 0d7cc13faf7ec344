//! What `start` checks before it changes anything: the entry, both shards in the registry, the
//! method the source allows, the entity's tables on both sides (columns, types, replica
//! identity), no rows of the entity on the target yet, fences a move can start from. Each refusal
//! names the table or shard and the fix.

use std::fmt;

use shard_directory_client::{EntityKey, State};
use tokio_postgres::Client;

use crate::catalog::{self, EntityTable};
use crate::entry;
use crate::error::{At, Error, Place, Step};
use crate::fence::{self, Fence};
use crate::mover::MethodChoice;
use crate::purge;
use crate::record::Method;
use crate::registry::{self, Overrides};
use crate::side::Side;

/// What a move would do, as preflight found it (`--dry-run`).
#[derive(Debug, Clone)]
pub struct Plan {
    pub entity: EntityKey,
    pub source: String,
    pub target: String,
    pub method: Method,
    /// Each table of the entity (parents first) and its rows of the entity on the source.
    pub tables: Vec<(String, i64)>,
    pub source_fence: Fence,
    pub target_fence: Fence,
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
        let steps = match self.method {
            Method::Logical => {
                "begin_move; publication + subscription (copy, then stream); wait for a small lag; \
                 freeze; catch up; verify; sequences; fence target; complete_move; fence source; \
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

/// What `start` checks before it changes anything. Returns the plan, the entity's tables
/// (parents first) and connections to both shards.
pub(crate) async fn preflight(
    directory: &Client,
    overrides: &Overrides,
    method: MethodChoice,
    key: &EntityKey,
    target_name: &str,
) -> Result<(Plan, Vec<EntityTable>, Side, Side), Error> {
    let refuse = |problem: String, fix: String| Err(Error::Preflight { problem, fix });
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
    let source = Side::connect(
        registry::endpoint(directory, overrides, &entry.shard_name).await?,
        None,
    )
    .await?;
    let target = Side::connect(
        registry::endpoint(directory, overrides, target_name).await?,
        None,
    )
    .await?;
    let (s, g) = (source.name().to_owned(), target.name().to_owned());
    let at_source = |e| Error::Db {
        step: Step::Preflight,
        place: Place::Shard(s.clone()),
        source: e,
    };
    let at_target = |e| Error::Db {
        step: Step::Preflight,
        place: Place::Shard(g.clone()),
        source: e,
    };

    let wal_level: String = source
        .client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .map_err(at_source)?
        .get(0);
    let method = match (method, wal_level == "logical") {
        (MethodChoice::Auto | MethodChoice::Logical, true) => Method::Logical,
        (MethodChoice::Auto | MethodChoice::Copy, _) => Method::Copy,
        (MethodChoice::Logical, false) => {
            return refuse(
                format!(
                    "source shard {s} has wal_level = {wal_level}; the logical method needs logical"
                ),
                format!(
                    "ALTER SYSTEM SET wal_level = logical and restart shard {s} (it also needs \
                     free replication slots and WAL senders), or use --method copy"
                ),
            );
        }
    };

    let kind = &key.entity_type;
    let tables = catalog::describe(&source.client, kind)
        .await
        .map_err(at_source)?;
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
    let on_target = catalog::describe(&target.client, kind)
        .await
        .map_err(at_target)?;
    for t in &tables {
        let (name, key_column) = (&t.name, &t.key_column);
        let protect = format!("SELECT shard_directory.protect('{name}', '{key_column}', '{kind}')");
        let Some(there) = on_target.iter().find(|x| x.name == t.name) else {
            return if catalog::exists(&target.client, &t.quoted)
                .await
                .map_err(at_target)?
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
        if method == Method::Logical && !t.identity_covers_key {
            return refuse(
                format!(
                    "table {name} on source shard {s}: its replica identity does not include \
                     the key column {key_column}, so a publication filtered on it could not \
                     publish its updates and deletes (and would refuse them)"
                ),
                format!(
                    "ALTER TABLE {name} REPLICA IDENTITY FULL, or make {key_column} part of \
                     its primary key, on shard {s}; or use --method copy"
                ),
            );
        }
    }
    if let Some(table) = purge::first_table_with_rows(&target.client, &tables, key)
        .await
        .map_err(at_target)?
    {
        return refuse(
            format!("target shard {g} already has rows of {key} in table {table}"),
            format!(
                "delete them first (a move with --keep-source leaves rows behind; \
                 `shard-directory history {kind} {}` shows where the entity has been), or \
                 choose another target",
                key.entity_id
            ),
        );
    }
    let source_fence = fence::read(&source.client, key).await.map_err(at_source)?;
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
    let target_fence = fence::read(&target.client, key).await.map_err(at_target)?;
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
    let mut rows = Vec::new();
    for t in &tables {
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
            .map_err(at_source)?
            .get(0);
        rows.push((t.name.clone(), n));
    }
    let plan = Plan {
        entity: key.clone(),
        source: s.clone(),
        target: g.clone(),
        method,
        tables: rows,
        source_fence,
        target_fence,
    };
    Ok((plan, tables, source, target))
}
