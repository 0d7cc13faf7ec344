//! Foreign keys of the entity's rows. None may cross to another entity's rows: a move would
//! carry one end and leave the other, and deleting the source's rows would cascade to another
//! entity's rows or be refused. And on the target, every row the moved rows reference must be
//! there before the cutover: logical replication applies rows without checking foreign keys.

use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use shard_directory_protocol::EntityKey;

use crate::error::{At, Error, Place, Step};
use crate::run::checks::tracking::Changed;
use crate::shards::catalog::{EntityTable, ForeignKey};

/// A foreign key between two of the entity's tables that does not match key column to key
/// column, so a row of one entity may reference a row of another.
pub(crate) struct Crossing<'t> {
    pub from: &'t EntityTable,
    pub key: &'t ForeignKey,
    pub to: &'t EntityTable,
}

/// Every foreign key among `tables` that can cross entities.
pub(crate) fn crossings(tables: &[EntityTable]) -> Vec<Crossing<'_>> {
    let mut found = Vec::new();
    for from in tables {
        for key in &from.foreign_keys {
            let Some(to) = tables.iter().find(|t| t.name == key.table) else {
                continue;
            };
            let ties = key
                .columns
                .iter()
                .zip(&key.referenced)
                .any(|(c, r)| *c == from.key_quoted && *r == to.key_quoted);
            if !ties {
                found.push(Crossing { from, key, to });
            }
        }
    }
    found
}

fn join(c: &Crossing<'_>) -> String {
    c.key
        .columns
        .iter()
        .zip(&c.key.referenced)
        .map(|(a, b)| format!("f.{a} = r.{b}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

fn predicate(t: &EntityTable, alias: &str) -> String {
    format!("{alias}.{}", t.entity_predicate())
}

/// Rows of other entities that reference the entity's rows through `c` (first 5, by key).
pub(crate) fn referencing_sql(c: &Crossing<'_>) -> String {
    crossing_sql(c, (c.to, "r"), (c.from, "f"))
}

/// Rows of the entity that reference other entities' rows through `c` (first 5, by key).
fn referenced_sql(c: &Crossing<'_>) -> String {
    crossing_sql(c, (c.from, "f"), (c.to, "r"))
}

/// Rows of `c.from` (as `f`) joined through `c` to rows of `c.to` (as `r`), where the side
/// `entity` is the entity's row and the side `other` is not.
fn crossing_sql(
    c: &Crossing<'_>,
    (entity, entity_alias): (&EntityTable, &str),
    (other, other_alias): (&EntityTable, &str),
) -> String {
    format!(
        "SELECT {} FROM {} f JOIN {} r ON {} WHERE {} AND {other_alias}.{} IS DISTINCT FROM ($1::text)::{} LIMIT 5",
        c.from.row_key_at("f"),
        c.from.quoted,
        c.to.quoted,
        join(c),
        predicate(entity, entity_alias),
        other.key_quoted,
        other.key_type
    )
}

/// The error for rows found crossing entities through `c`.
pub(crate) fn crossing_error(c: &Crossing<'_>, entity: &EntityKey, rows: Vec<String>) -> Error {
    Error::CrossEntity {
        entity: entity.clone(),
        constraint: c.key.name.clone(),
        from: c.from.name.clone(),
        rows,
    }
}

/// The row keys `sql` (with the entity id as `$1`, `more` from `$2`) finds in `table` on `shard`.
async fn row_keys(
    client: &Client,
    (sql, more): (&str, &[&(dyn ToSql + Sync)]),
    entity: &EntityKey,
    step: Step,
    (shard, table): (&str, &str),
) -> Result<Vec<String>, Error> {
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&entity.entity_id];
    params.extend_from_slice(more);
    let rows = client.query(sql, &params).await;
    let place = Place::Table {
        shard: shard.to_owned(),
        table: table.to_owned(),
    };
    Ok(rows.at(step, place)?.iter().map(|r| r.get(0)).collect())
}

/// Refuses when a row of the entity references, or is referenced by, a row of another entity
/// on `shard`.
pub(crate) async fn check_crossings(
    client: &Client,
    shard: &str,
    tables: &[EntityTable],
    entity: &EntityKey,
    step: Step,
) -> Result<(), Error> {
    for c in crossings(tables) {
        for sql in [referencing_sql(&c), referenced_sql(&c)] {
            let rows = row_keys(client, (&sql, &[]), entity, step, (shard, &c.from.name)).await?;
            if !rows.is_empty() {
                return Err(crossing_error(&c, entity, rows));
            }
        }
    }
    Ok(())
}

/// Refuses when a row of the entity on the target references a row the target does not have
/// (foreign keys with any column NULL reference nothing, as MATCH SIMPLE has it). Only keys into
/// tables that are not the entity's are read: a key into one of its tables either matches key
/// to key (the referenced rows are the entity's, which verification found identical to the
/// source's, where the key holds) or crosses entities ([`check_crossings`]). With `only`, just
/// the rows changed since the online check: a row the target had then keeps what it references
/// (the target's foreign key refuses deleting that).
pub(crate) async fn check_references_present(
    target: &Client,
    shard: &str,
    tables: &[EntityTable],
    entity: &EntityKey,
    only: Option<&Changed>,
) -> Result<(), Error> {
    for t in tables {
        let (clause, columns) = match only.map(|c| c.table(&t.name)) {
            None => (String::new(), Vec::new()),
            Some(None) => continue,
            Some(Some(c)) if c.all => (String::new(), Vec::new()),
            Some(Some(c)) => (t.keys_join("f", 2), c.columns(t.primary_key.len())),
        };
        let more: Vec<&(dyn ToSql + Sync)> =
            columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        let outside = t
            .foreign_keys
            .iter()
            .filter(|k| !tables.iter().any(|other| other.name == k.table));
        for key in outside {
            let present = key
                .columns
                .iter()
                .map(|c| format!("f.{c} IS NOT NULL"))
                .chain(std::iter::once(format!(
                    "NOT EXISTS (SELECT 1 FROM {} r WHERE {})",
                    key.quoted,
                    key.columns
                        .iter()
                        .zip(&key.referenced)
                        .map(|(a, b)| format!("r.{b} = f.{a}"))
                        .collect::<Vec<_>>()
                        .join(" AND ")
                )))
                .collect::<Vec<_>>()
                .join(" AND ");
            let sql = format!(
                "SELECT {} FROM {} f {clause} WHERE {} AND {present} LIMIT 5",
                t.row_key_at("f"),
                t.quoted,
                predicate(t, "f")
            );
            let found = row_keys(
                target,
                (&sql, &more),
                entity,
                Step::Verify,
                (shard, &t.name),
            );
            let rows = found.await?;
            if !rows.is_empty() {
                return Err(Error::MissingReference {
                    shard: shard.to_owned(),
                    table: t.name.clone(),
                    constraint: key.name.clone(),
                    referenced: key.table.clone(),
                    rows,
                });
            }
        }
    }
    Ok(())
}
