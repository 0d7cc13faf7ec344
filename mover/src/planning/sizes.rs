//! Each entity's size on a shard, in rows and bytes, and its load: what `drain`, `split` and
//! `rebalance` weigh tenants by. Cheap: a protected table of up to [`WHOLE_PAGES`] pages is read
//! whole (exact counts); a larger one through `TABLESAMPLE SYSTEM` over about that many of its
//! pages, scaled up, so an entity with few rows in a large table may be estimated at none. The
//! load is the shard's `entity_stats()` (checked transactions per second over its window).
//!
//! Rows and bytes are kept in the directory (`shard_sizes`, a row per shard), so that plans made
//! within `--sizes-max-age` of a measure read them there instead of scanning the shard again;
//! a shard whose kept sizes lack an entity the directory now places on it (one moved there since)
//! is measured again. The load is read afresh each time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::error::{At, Error, Place, Step};
use crate::shards::catalog;

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

/// How a shard's sizes are kept in `shard_sizes.sizes`: `{"<type>": {"<id>": [rows, bytes]}}`.
type Kept = BTreeMap<String, BTreeMap<String, (i64, i64)>>;

/// The sizes of `placed`, the entities of `entity_types` the directory places on `shard` (with
/// `load`, their load too), and how old they are when read from the directory (`None`: measured
/// now). With `keep`, sizes measured now are kept in the directory for the next plan; without
/// it (a look that must change nothing) they are not, and kept sizes that cannot be read are
/// measured.
pub(crate) async fn weighed(
    directory: &Client,
    (client, shard): (&Client, &str),
    (placed, entity_types): (&[EntityKey], &[String]),
    load: bool,
    (max_age, keep_them): (Duration, bool),
) -> Result<(BTreeMap<EntityKey, Size>, Option<Duration>), Error> {
    let kept = match kept(directory, shard, placed, max_age).await {
        Ok(k) => k,
        Err(e) if keep_them => return Err(e),
        Err(_) => None,
    };
    let (mut sizes, age) = match kept {
        Some((sizes, age)) => (sizes, Some(age)),
        None => {
            let measured = measured(client, shard, entity_types).await?;
            let sizes = placed
                .iter()
                .map(|k| (k.clone(), measured.get(k).copied().unwrap_or_default()))
                .collect();
            if keep_them {
                keep(directory, shard, &sizes).await?;
            }
            (sizes, None)
        }
    };
    if load {
        for (key, per_second) in loads(client, shard).await? {
            if let Some(size) = sizes.get_mut(&key) {
                size.load += per_second;
            }
        }
    }
    Ok((sizes, age))
}

/// The sizes the directory keeps for `shard`, when they are at most `max_age` old and hold every
/// entity of `placed`.
async fn kept(
    directory: &Client,
    shard: &str,
    placed: &[EntityKey],
    max_age: Duration,
) -> Result<Option<(BTreeMap<EntityKey, Size>, Duration)>, Error> {
    let row = directory
        .query_opt(
            "SELECT sizes::text, extract(epoch FROM now() - measured_at)::float8 \
             FROM shard_directory.shard_sizes WHERE shard_name = $1",
            &[&shard],
        )
        .await
        .at(Step::Plan, Place::Directory)?;
    let Some(row) = row else { return Ok(None) };
    let age = Duration::from_secs_f64(row.get::<_, f64>(1).max(0.0));
    if age > max_age {
        return Ok(None);
    }
    let Ok(kept) = serde_json::from_str::<Kept>(row.get(0)) else {
        return Ok(None);
    };
    let mut sizes = BTreeMap::new();
    for key in placed {
        let Some(&(rows, bytes)) = kept
            .get(&key.entity_type)
            .and_then(|ids| ids.get(&key.entity_id))
        else {
            return Ok(None);
        };
        let size = Size {
            rows,
            bytes,
            load: 0.0,
        };
        sizes.insert(key.clone(), size);
    }
    Ok(Some((sizes, age)))
}

/// Keeps `sizes` in the directory as `shard`'s, measured now.
async fn keep(
    directory: &Client,
    shard: &str,
    sizes: &BTreeMap<EntityKey, Size>,
) -> Result<(), Error> {
    let mut kept = Kept::new();
    for (key, size) in sizes {
        kept.entry(key.entity_type.clone())
            .or_default()
            .insert(key.entity_id.clone(), (size.rows, size.bytes));
    }
    let json = serde_json::to_string(&kept).expect("plain data serialises");
    directory
        .execute(
            "INSERT INTO shard_directory.shard_sizes AS s (shard_name, sizes) \
             VALUES ($1, $2::text::jsonb) \
             ON CONFLICT (shard_name) DO UPDATE SET sizes = excluded.sizes, measured_at = now()",
            &[&shard, &json],
        )
        .await
        .at(Step::Plan, Place::Directory)?;
    Ok(())
}

/// The rows and bytes of every entity of `entity_types` with rows on `shard`.
async fn measured(
    client: &Client,
    shard: &str,
    entity_types: &[String],
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
    Ok(sizes)
}

/// One table's rows of an entity, counted, and their bytes (`pg_column_size` of each row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableSize {
    pub table: String,
    pub rows: i64,
    pub bytes: i64,
}

/// `key`'s rows and bytes in each of its tables on `shard` (parents first), read whole: exact,
/// not sampled as the planners' sizes are. An id that is not canonical for a table's key type
/// (`08842` for a bigint) is refused, as a move refuses it: its rows would be another id's.
pub(crate) async fn of_entity(
    client: &Client,
    shard: &str,
    key: &EntityKey,
) -> Result<Vec<TableSize>, Error> {
    let tables = catalog::describe(client, &key.entity_type)
        .await
        .at(Step::Plan, shard)?;
    let mut sizes = Vec::new();
    for t in &tables {
        crate::preflight::canonical_on(client, shard, t, key).await?;
        let sql = format!(
            "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)::int8 FROM {} t WHERE t.{}",
            t.quoted,
            t.entity_predicate()
        );
        let row = client
            .query_one(&sql, &[&key.entity_id])
            .await
            .at(Step::Plan, shard)?;
        sizes.push(TableSize {
            table: t.name.clone(),
            rows: row.get(0),
            bytes: row.get(1),
        });
    }
    Ok(sizes)
}

/// The load of each entity with checked transactions in `shard`'s window.
async fn loads(client: &Client, shard: &str) -> Result<Vec<(EntityKey, f64)>, Error> {
    Ok(client
        .query(
            "SELECT entity_type, entity_id, per_second FROM shard_directory.entity_stats($1)",
            &[&LOAD_TOP],
        )
        .await
        .at(Step::Plan, shard)?
        .iter()
        .map(|row| {
            let key = EntityKey::new(row.get::<_, String>(0), row.get::<_, String>(1));
            (key, row.get(2))
        })
        .collect())
}
