//! Each entity's size on a shard, in rows and bytes, and its load: what `drain`, `split` and
//! `rebalance` weigh tenants by. Cheap: a protected table of up to [`WHOLE_PAGES`] pages is read
//! whole (exact counts); a larger one through `TABLESAMPLE SYSTEM` over about that many of its
//! pages, scaled up, so an entity with few rows in a large table may be estimated at none. The
//! load is the shard's `entity_stats()` (checked transactions per second over its window).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::catalog;
use crate::error::{At, Error, Step};

/// Pages of a table read whole; a larger table is sampled down to about this many.
const WHOLE_PAGES: i64 = 12_800;

/// Rows of `entity_stats()` read from a shard for the load: all it holds (at most 1,024).
const LOAD_TOP: i32 = i32::MAX;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Size {
    pub rows: i64,
    pub bytes: i64,
    /// Checked transactions per second, from the shard's `entity_stats()`.
    pub load: f64,
}

impl std::ops::AddAssign for Size {
    fn add_assign(&mut self, other: Size) {
        self.rows += other.rows;
        self.bytes += other.bytes;
        self.load += other.load;
    }
}

/// What a plan weighs entities and shards by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Weigh {
    Rows,
    Bytes,
    Load,
}

impl Size {
    pub fn weight(&self, by: Weigh) -> f64 {
        match by {
            Weigh::Rows => self.rows as f64,
            Weigh::Bytes => self.bytes as f64,
            Weigh::Load => self.load,
        }
    }
}

/// The size of every entity of `entity_types` with rows on `shard`, and with `load` the load of
/// those with checked transactions in its window.
pub(crate) async fn on_shard(
    client: &Client,
    shard: &str,
    entity_types: &[String],
    load: bool,
) -> Result<BTreeMap<EntityKey, Size>, Error> {
    let mut sizes: BTreeMap<EntityKey, Size> = BTreeMap::new();
    for kind in entity_types {
        let tables = catalog::describe(client, kind)
            .await
            .at(Step::Plan, shard)?;
        for t in &tables {
            let pages: i64 = client
                .query_one(
                    "SELECT coalesce(sum(pg_relation_size(relid)), 0)::int8 \
                            / current_setting('block_size')::int8 \
                     FROM pg_partition_tree($1::text::regclass)",
                    &[&t.quoted],
                )
                .await
                .at(Step::Plan, shard)?
                .get(0);
            // TABLESAMPLE takes a real.
            let percent: f32 = if pages <= WHOLE_PAGES {
                100.0
            } else {
                (100.0 * WHOLE_PAGES as f64 / pages as f64) as f32
            };
            let sql = format!(
                "SELECT t.{key}::text, count(*), sum(pg_column_size(t.*))::int8 \
                 FROM {table} t TABLESAMPLE SYSTEM ($1) WHERE t.{key} IS NOT NULL GROUP BY 1",
                key = t.key_quoted,
                table = t.quoted
            );
            let scale = 100.0 / f64::from(percent);
            for row in client
                .query(&sql, &[&percent])
                .await
                .at(Step::Plan, shard)?
            {
                let key = EntityKey::new(kind.clone(), row.get::<_, String>(0));
                *sizes.entry(key).or_default() += Size {
                    rows: (row.get::<_, i64>(1) as f64 * scale).round() as i64,
                    bytes: (row.get::<_, i64>(2) as f64 * scale).round() as i64,
                    load: 0.0,
                };
            }
        }
    }
    if !load {
        return Ok(sizes);
    }
    for row in client
        .query(
            "SELECT entity_type, entity_id, per_second FROM shard_directory.entity_stats($1)",
            &[&LOAD_TOP],
        )
        .await
        .at(Step::Plan, shard)?
    {
        let key = EntityKey::new(row.get::<_, String>(0), row.get::<_, String>(1));
        if entity_types.contains(&key.entity_type) {
            sizes.entry(key).or_default().load += row.get::<_, f64>(2);
        }
    }
    Ok(sizes)
}
