//! Reconciling without moving: rows of entities that sit on a shard the directory does not name
//! for them (the guide's rows "found weeks later by reconciliation"), and one entity's rows
//! compared between the shard the directory names and another.

use std::collections::BTreeMap;

use serde::Serialize;
use shard_directory_protocol::{EntityKey, State};
use tokio_postgres::Client;

use crate::directory::entry::{self, Placement};
use crate::error::{At, Error, Place, Step};
use crate::shards::catalog::{self, EntityTable};
use crate::shards::fence::{self, Fence};

/// An entity with rows on a shard its directory entry does not name (nor names as the target of a
/// move under way).
#[derive(Debug, Clone, Serialize)]
pub struct Stray {
    pub entity: EntityKey,
    pub shard: String,
    /// Its entry: where the directory says it is; `None` when it has no entry at all.
    pub placement: Option<Placement>,
    /// Its fence on that shard (`moved` for the rows a `--keep-source` move left behind).
    pub fence: Fence,
    /// Rows per table on that shard.
    pub rows: BTreeMap<String, i64>,
}

/// The entity types protected on the shard (all of them, or `only`).
async fn entity_types(
    client: &Client,
    only: Option<&str>,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT DISTINCT entity_type FROM shard_directory.protected_tables() \
             WHERE $1::text IS NULL OR entity_type = $1 ORDER BY 1",
            &[&only],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Rows per entity id in `t` (the id as the shard's check reads it: a key cast to text is its
/// canonical text, and `char(n)` loses its padding there too).
async fn rows_per_entity(
    client: &Client,
    t: &EntityTable,
) -> Result<Vec<(String, i64)>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {key}::text, count(*) FROM {table} WHERE {key} IS NOT NULL GROUP BY 1",
        key = t.key_quoted,
        table = t.quoted
    );
    let rows = client.query(&sql, &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Whether rows of an entity whose entry is `placement` belong on `shard`.
fn belongs(placement: Option<&Placement>, shard: &str) -> bool {
    placement.is_some_and(|p| {
        p.shard_name == shard
            || (p.state != State::Active && p.target_shard.as_deref() == Some(shard))
    })
}

/// Every entity with rows on `shard` (of `entity_type`, or of every type protected there) whose
/// directory entry does not name that shard. Reads every protected table of the shard whole.
pub(crate) async fn strays(
    directory: &Client,
    client: &Client,
    shard: &str,
    entity_type: Option<&str>,
) -> Result<Vec<Stray>, Error> {
    let mut found = Vec::new();
    for kind in entity_types(client, entity_type)
        .await
        .at(Step::Verify, shard)?
    {
        let tables = catalog::describe(client, &kind)
            .await
            .at(Step::Verify, shard)?;
        let mut by_id: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for t in &tables {
            let place = Place::Table {
                shard: shard.to_owned(),
                table: t.name.clone(),
            };
            for (id, n) in rows_per_entity(client, t).await.at(Step::Verify, place)? {
                by_id.entry(id).or_default().insert(t.name.clone(), n);
            }
        }
        let ids: Vec<&str> = by_id.keys().map(String::as_str).collect();
        let mut entries = std::collections::HashMap::new();
        for chunk in ids.chunks(1000) {
            let read = entry::read_many(directory, &kind, chunk).await;
            entries.extend(read.at(Step::Verify, Place::Directory)?);
        }
        for (id, rows) in by_id {
            let placement = entries.remove(&id);
            if belongs(placement.as_ref(), shard) {
                continue;
            }
            let entity = EntityKey::new(&kind, &id);
            let fence = fence::read(client, &entity).await.at(Step::Verify, shard)?;
            found.push(Stray {
                entity,
                shard: shard.to_owned(),
                placement,
                fence,
                rows,
            });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_belong_where_the_entry_says_or_where_it_is_moving() {
        let p = |shard: &str, state, target: Option<&str>| Placement {
            shard_name: shard.into(),
            state,
            target_shard: target.map(Into::into),
            version: 1,
        };
        assert!(belongs(Some(&p("s1", State::Active, None)), "s1"));
        assert!(!belongs(Some(&p("s1", State::Active, None)), "s2"));
        assert!(belongs(Some(&p("s1", State::Migrating, Some("s2"))), "s2"));
        assert!(belongs(Some(&p("s1", State::ReadOnly, Some("s2"))), "s2"));
        assert!(!belongs(Some(&p("s1", State::Migrating, Some("s2"))), "s3"));
        assert!(!belongs(None, "s1"));
    }
}
