//! Verification while the entity is frozen: per table, the row count and an order-independent
//! hash of the entity's rows (the sum of each row's 64-bit hash) on both sides. On a mismatch the
//! rows are compared one by one to name the differing keys.

use std::collections::BTreeMap;

use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::error::{At, Error, Place, Step};

async fn summary(
    client: &Client,
    t: &EntityTable,
    key: &EntityKey,
) -> Result<(i64, String), tokio_postgres::Error> {
    let sql = format!(
        "SELECT count(*), coalesce(sum(hashtextextended(ROW({})::text, 0)::numeric), 0)::text \
         FROM {} WHERE {}",
        t.column_list(),
        t.quoted,
        t.entity_predicate()
    );
    let row = client.query_one(&sql, &[&key.entity_id]).await?;
    Ok((row.get(0), row.get(1)))
}

/// Row key -> hashes of the rows with that key (several when a table has no primary key).
async fn rows(
    client: &Client,
    t: &EntityTable,
    key: &EntityKey,
) -> Result<BTreeMap<String, Vec<i64>>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {}, hashtextextended(ROW({})::text, 0) FROM {} t WHERE {}",
        t.row_key_at("t"),
        t.column_list(),
        t.quoted,
        t.entity_predicate()
    );
    let mut map: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in client.query(&sql, &[&key.entity_id]).await? {
        map.entry(r.get(0)).or_default().push(r.get(1));
    }
    for hashes in map.values_mut() {
        hashes.sort_unstable();
    }
    Ok(map)
}

/// The first 20 keys whose rows differ between the two sides.
fn differing(
    source: &BTreeMap<String, Vec<i64>>,
    target: &BTreeMap<String, Vec<i64>>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = source.keys().chain(target.keys()).collect();
    keys.into_iter()
        .filter(|k| source.get(*k) != target.get(*k))
        .take(20)
        .cloned()
        .collect()
}

/// Checks every table; returns the rows per table when both sides agree.
pub(crate) async fn verify(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<Vec<(String, i64)>, Error> {
    let mut counts = Vec::new();
    for t in tables {
        let at = |shard: &str| Place::Table {
            shard: shard.to_owned(),
            table: t.name.clone(),
        };
        let (s, g) = tokio::join!(summary(source, t, key), summary(target, t, key));
        let (s, g) = (
            s.at(Step::Verify, at(source_name))?,
            g.at(Step::Verify, at(target_name))?,
        );
        if s != g {
            let (a, b) = tokio::join!(rows(source, t, key), rows(target, t, key));
            let (a, b) = (
                a.at(Step::Verify, at(source_name))?,
                b.at(Step::Verify, at(target_name))?,
            );
            return Err(Error::Mismatch {
                table: t.name.clone(),
                source_rows: s.0,
                target_rows: g.0,
                keys: differing(&a, &b),
            });
        }
        counts.push((t.name.clone(), s.0));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_keys_are_the_missing_the_extra_and_the_changed() {
        let side = |rows: Vec<(String, i64)>| {
            let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for (k, h) in rows {
                m.entry(k).or_default().push(h);
            }
            m
        };
        let rows = |r: &[(&str, i64)]| r.iter().map(|(k, h)| (k.to_string(), *h)).collect();
        let source = side(rows(&[("(1)", 10), ("(2)", 20), ("(3)", 30)]));
        let target = side(rows(&[("(1)", 10), ("(3)", 31), ("(4)", 40)]));
        assert_eq!(differing(&source, &target), ["(2)", "(3)", "(4)"]);
        let many = side((0..50).map(|i| (format!("({i:02})"), i)).collect());
        assert_eq!(differing(&many, &BTreeMap::new()).len(), 20);
    }
}
