//! Whether the entity's rows are the same on both shards, per table: the row count and an
//! order-independent hash of the rows (the sum of each row's 64-bit hash); on a mismatch the rows
//! are compared one by one to name the differing keys. Three checks:
//! - [`verify`]: every row, on both sides (a freeze whose changes could not be tracked, and
//!   `shard-directory verify entity`);
//! - [`online`]: while the entity is writable, per bucket of primary keys, so that rows a write
//!   in flight leaves different are found by key: they are checked again under the freeze;
//! - [`recheck`]: under the freeze, only the rows of keys that differed online or changed since
//!   ([`Changed`]), so the freeze does not grow with the entity; [`still_differing`] is the same
//!   comparison just before the freeze, which keeps the keys still different and times it.

use std::collections::{BTreeMap, BTreeSet};

use shard_directory_protocol::EntityKey;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use crate::error::{At, Error, Place, Step};
use crate::run::checks::tracking::{Changed, TableChanges};
use crate::shards::catalog::EntityTable;

/// Buckets of primary keys the online check sums separately (a power of two).
const BUCKETS: i32 = 4096;

/// The 64-bit hash of a row of `t` read as `t`.
fn row_hash(t: &EntityTable) -> String {
    let columns: Vec<String> = t
        .columns
        .iter()
        .map(|c| format!("t.{}", c.quoted))
        .collect();
    format!("hashtextextended(ROW({})::text, 0)", columns.join(", "))
}

/// The bucket of a row of `t` read as `t`.
fn bucket(t: &EntityTable) -> String {
    format!(
        "(hashtextextended({}, 0) & {})::int4",
        t.row_key_at("t"),
        BUCKETS - 1
    )
}

async fn summary(
    client: &Client,
    t: &EntityTable,
    key: &EntityKey,
) -> Result<(i64, String), tokio_postgres::Error> {
    let sql = format!(
        "SELECT count(*), coalesce(sum({}::numeric), 0)::text FROM {} t WHERE t.{}",
        row_hash(t),
        t.quoted,
        t.entity_predicate()
    );
    let row = client.query_one(&sql, &[&key.entity_id]).await?;
    Ok((row.get(0), row.get(1)))
}

/// Row key -> hashes of the rows with that key (several when a table has no primary key), and
/// the primary key's values as text.
type Rows = BTreeMap<String, (Vec<i64>, Vec<String>)>;

/// The entity's rows of `t` that `clause` (after `FROM table t`, with `$1` the entity id and
/// `params` from `$2`) selects.
async fn rows(
    client: &Client,
    t: &EntityTable,
    key: &EntityKey,
    clause: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Rows, tokio_postgres::Error> {
    let primary_key: Vec<String> = t
        .primary_key
        .iter()
        .map(|c| format!("t.{c}::text"))
        .collect();
    let sql = format!(
        "SELECT {}, {}, ARRAY[{}]::text[] FROM {} t {clause} WHERE t.{}",
        t.row_key_at("t"),
        row_hash(t),
        primary_key.join(", "),
        t.quoted,
        t.entity_predicate()
    );
    let mut all: Vec<&(dyn ToSql + Sync)> = vec![&key.entity_id];
    all.extend_from_slice(params);
    let mut map = Rows::new();
    for r in client.query(&sql, &all).await? {
        let entry = map.entry(r.get(0)).or_default();
        entry.0.push(r.get(1));
        entry.1 = r.get(2);
    }
    for (hashes, _) in map.values_mut() {
        hashes.sort_unstable();
    }
    Ok(map)
}

/// The keys whose rows differ between the two sides, with their primary key values.
fn differing<'r>(source: &'r Rows, target: &'r Rows) -> Vec<(&'r String, &'r Vec<String>)> {
    let keys: BTreeSet<&String> = source.keys().chain(target.keys()).collect();
    keys.into_iter()
        .filter(|k| source.get(*k).map(|r| &r.0) != target.get(*k).map(|r| &r.0))
        .map(|k| {
            (
                k,
                &source
                    .get(k)
                    .or_else(|| target.get(k))
                    .expect("a side has it")
                    .1,
            )
        })
        .collect()
}

fn mismatch(t: &EntityTable, (a, b): (&Rows, &Rows), changed_only: bool) -> Option<Error> {
    let differ = differing(a, b);
    let rows = |side: &Rows| side.values().map(|r| r.0.len() as i64).sum();
    (!differ.is_empty()).then(|| Error::Mismatch {
        table: t.name.clone(),
        source_rows: rows(a),
        target_rows: rows(b),
        changed_only,
        keys: differ
            .into_iter()
            .take(20)
            .map(|(k, _)| k.clone())
            .collect(),
    })
}

fn place(shard: &str, t: &EntityTable) -> Place {
    Place::Table {
        shard: shard.to_owned(),
        table: t.name.clone(),
    }
}

/// Compares every row of `t`; its row count when both sides agree.
async fn compare_all(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    t: &EntityTable,
    key: &EntityKey,
) -> Result<i64, Error> {
    let (s, g) = tokio::join!(summary(source, t, key), summary(target, t, key));
    let (s, g) = (
        s.at(Step::Verify, place(source_name, t))?,
        g.at(Step::Verify, place(target_name, t))?,
    );
    if s == g {
        return Ok(s.0);
    }
    let (a, b) = tokio::join!(rows(source, t, key, "", &[]), rows(target, t, key, "", &[]));
    let (a, b) = (
        a.at(Step::Verify, place(source_name, t))?,
        b.at(Step::Verify, place(target_name, t))?,
    );
    Err(mismatch(t, (&a, &b), false).unwrap_or(Error::Mismatch {
        table: t.name.clone(),
        source_rows: s.0,
        target_rows: g.0,
        changed_only: false,
        keys: Vec::new(),
    }))
}

/// Checks every table; returns the rows per table when both sides agree.
pub(crate) async fn verify(
    source: (&Client, &str),
    target: (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<Vec<(String, i64)>, Error> {
    let mut counts = Vec::new();
    for t in tables {
        counts.push((t.name.clone(), compare_all(source, target, t, key).await?));
    }
    Ok(counts)
}

/// Rows of each table hashed to estimate what [`verify`] takes, before a move (`--dry-run`).
const SAMPLE: i64 = 20_000;

/// About how long [`verify`] takes on `shard`: each table's first rows of the entity (up to
/// [`SAMPLE`]) read and hashed as it does, the time scaled to the table's `rows`.
pub(crate) async fn estimate(
    (client, shard): (&Client, &str),
    tables: &[EntityTable],
    rows: &[(String, i64)],
    key: &EntityKey,
) -> Result<std::time::Duration, Error> {
    let mut total = std::time::Duration::ZERO;
    for (t, (_, rows)) in tables.iter().zip(rows).filter(|(_, (_, n))| *n > 0) {
        let (took, sampled) = sample((client, shard), t, key).await?;
        total += took.mul_f64(*rows as f64 / sampled.max(1) as f64);
    }
    Ok(total)
}

/// About how long [`verify`] takes per row of the entity on `shard`, from a sample of each
/// table's first rows of it; `None` when it has none.
pub(crate) async fn per_row(
    (client, shard): (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<Option<std::time::Duration>, Error> {
    let (mut took, mut sampled) = (std::time::Duration::ZERO, 0);
    for t in tables {
        let (time, rows) = sample((client, shard), t, key).await?;
        (took, sampled) = (took + time, sampled + rows);
    }
    Ok((sampled > 0).then(|| took / sampled as u32))
}

/// The time to read and hash the entity's first rows of `t` (up to [`SAMPLE`]), and how many.
async fn sample(
    (client, shard): (&Client, &str),
    t: &EntityTable,
    key: &EntityKey,
) -> Result<(std::time::Duration, i64), Error> {
    let sql = format!(
        "SELECT count(*), coalesce(sum(h::numeric), 0)::text \
         FROM (SELECT {} AS h FROM {} t WHERE t.{} LIMIT $2) s",
        row_hash(t),
        t.quoted,
        t.entity_predicate()
    );
    let started = std::time::Instant::now();
    let row = client
        .query_one(&sql, &[&key.entity_id, &SAMPLE])
        .await
        .at(Step::Preflight, place(shard, t))?;
    Ok((started.elapsed(), row.get(0)))
}

/// Row count and hash sum per bucket of primary keys.
async fn buckets(
    client: &Client,
    t: &EntityTable,
    key: &EntityKey,
) -> Result<BTreeMap<i32, (i64, String)>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {}, count(*), sum({}::numeric)::text FROM {} t WHERE t.{} GROUP BY 1",
        bucket(t),
        row_hash(t),
        t.quoted,
        t.entity_predicate()
    );
    let found = client.query(&sql, &[&key.entity_id]).await?;
    Ok(found
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect())
}

/// The online check, while the entity is writable (after change tracking started on both
/// shards): the source's row count per table, and the keys whose rows differ, which writes in
/// flight explain or the check under the freeze will find again.
pub(crate) async fn online(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<(Vec<(String, i64)>, Changed), Error> {
    let (mut counts, mut changed) = (Vec::new(), Changed::default());
    for t in tables {
        let (a, b) = tokio::join!(buckets(source, t, key), buckets(target, t, key));
        let (a, b) = (
            a.at(Step::Verify, place(source_name, t))?,
            b.at(Step::Verify, place(target_name, t))?,
        );
        counts.push((t.name.clone(), a.values().map(|(n, _)| n).sum()));
        let differ: Vec<i32> = a
            .keys()
            .chain(b.keys())
            .filter(|k| a.get(k) != b.get(k))
            .copied()
            .collect::<BTreeSet<i32>>()
            .into_iter()
            .collect();
        if differ.is_empty() {
            continue;
        }
        if t.primary_key.is_empty() {
            changed.all(&t.name);
            continue;
        }
        let clause = format!(
            "JOIN unnest($2::int4[]) AS sd_b(b) ON sd_b.b = {}",
            bucket(t)
        );
        let params: [&(dyn ToSql + Sync); 1] = [&differ];
        let (a, b) = tokio::join!(
            rows(source, t, key, &clause, &params),
            rows(target, t, key, &clause, &params)
        );
        let (a, b) = (
            a.at(Step::Verify, place(source_name, t))?,
            b.at(Step::Verify, place(target_name, t))?,
        );
        for (_, primary_key) in differing(&a, &b) {
            changed.key(&t.name, primary_key.clone());
        }
    }
    Ok((counts, changed))
}

/// The rows of `t` with the keys of `c`, on both sides.
async fn changed_rows(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    t: &EntityTable,
    key: &EntityKey,
    c: &TableChanges,
) -> Result<(Rows, Rows), Error> {
    let columns = c.columns(t.primary_key.len());
    let params: Vec<&(dyn ToSql + Sync)> =
        columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    let clause = t.keys_join("t", 2);
    let (a, b) = tokio::join!(
        rows(source, t, key, &clause, &params),
        rows(target, t, key, &clause, &params)
    );
    Ok((
        a.at(Step::Verify, place(source_name, t))?,
        b.at(Step::Verify, place(target_name, t))?,
    ))
}

/// The check under the freeze: the rows of every key in `changed`, on both sides (the whole
/// table where `changed` says so).
pub(crate) async fn recheck(
    source: (&Client, &str),
    target: (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
    changed: &Changed,
) -> Result<(), Error> {
    for t in tables {
        match changed.table(&t.name) {
            None => {}
            Some(c) if c.all => {
                compare_all(source, target, t, key).await?;
            }
            Some(c) => {
                let (a, b) = changed_rows(source, target, t, key, c).await?;
                if let Some(e) = mismatch(t, (&a, &b), true) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Before the freeze, while the entity is writable (its streams read up to now first): the keys
/// of `changed` whose rows still differ. A key whose rows are equal now, and that changes again,
/// comes back through the streams.
pub(crate) async fn still_differing(
    source: (&Client, &str),
    target: (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
    changed: &Changed,
) -> Result<Changed, Error> {
    let mut left = Changed::default();
    for t in tables {
        match changed.table(&t.name) {
            None => {}
            Some(c) if c.all => left.all(&t.name),
            Some(c) => {
                let (a, b) = changed_rows(source, target, t, key, c).await?;
                for (_, primary_key) in differing(&a, &b) {
                    left.key(&t.name, primary_key.clone());
                }
            }
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_keys_are_the_missing_the_extra_and_the_changed() {
        let side = |rows: &[(&str, i64)]| {
            let mut m = Rows::new();
            for (k, h) in rows {
                let entry = m.entry(k.to_string()).or_default();
                entry.0.push(*h);
                entry.1 = vec![k.to_string()];
            }
            m
        };
        let source = side(&[("(1)", 10), ("(2)", 20), ("(3)", 30)]);
        let target = side(&[("(1)", 10), ("(3)", 31), ("(4)", 40)]);
        let keys: Vec<&String> = differing(&source, &target)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["(2)", "(3)", "(4)"]);
    }
}
