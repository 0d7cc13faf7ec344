//! What changed in the entity's rows since the online check, on both shards, so that the check
//! under the freeze reads those rows only and the freeze does not grow with the entity.
//!
//! Each shard gets a publication of the entity's rows (`sd_move_<id>_track`, row-filtered like
//! the move's own, truncations included) and a temporary `pgoutput` slot on it, held by a session
//! of its own: the slot is created before the online check reads anything, so every change the
//! check's snapshots miss is in its stream, whoever made it (the application, the subscription's
//! apply, a superuser with the triggers off: the stream is the WAL). The mover drains both
//! streams into [`Changed`], the primary keys changed per table. A session that ends takes its
//! slot with it, so a mover that dies leaves no slot holding WAL; the next run checks online again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::error::{At, Error, Step};
use crate::run::checks::pgoutput::{self, Message, Relation, Value};
use crate::run::replication::logical;
use crate::shards::catalog::{self, EntityTable};
use crate::shards::side::Side;

/// The rows of one table changed since the online check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TableChanges {
    /// Changes that name no primary key (a table without one, a truncation, a key column the
    /// stream did not carry): the whole table is checked again.
    pub all: bool,
    /// Primary key values, as text, in the primary key's column order.
    pub keys: BTreeSet<Vec<String>>,
}

impl TableChanges {
    /// The keys as one text array per primary key column: the parameters of
    /// [`EntityTable::keys_join`].
    pub fn columns(&self, width: usize) -> Vec<Vec<String>> {
        (0..width)
            .map(|i| self.keys.iter().map(|k| k[i].clone()).collect())
            .collect()
    }
}

/// The rows changed since the online check, per table (`schema.table`).
#[derive(Debug, Default)]
pub(crate) struct Changed(BTreeMap<String, TableChanges>);

impl Changed {
    pub fn all(&mut self, table: &str) {
        self.0.entry(table.to_owned()).or_default().all = true;
    }

    pub fn key(&mut self, table: &str, key: Vec<String>) {
        self.0.entry(table.to_owned()).or_default().keys.insert(key);
    }

    pub fn table(&self, table: &str) -> Option<&TableChanges> {
        self.0.get(table)
    }

    /// How many keys wait to be checked again (a whole table counts as one).
    pub fn len(&self) -> usize {
        self.0
            .values()
            .map(|t| if t.all { 1 } else { t.keys.len() })
            .sum()
    }
}

fn name(move_id: i64) -> String {
    format!("sd_move_{move_id}_track")
}

/// One shard's stream of the entity's changes.
pub(crate) struct Tracker {
    client: Client,
    shard: String,
    slot: String,
    relations: HashMap<u32, Relation>,
}

/// Why tracking could not start on a shard: a setting or a privilege it lacks.
fn untrackable(e: &tokio_postgres::Error) -> bool {
    [
        SqlState::INSUFFICIENT_PRIVILEGE,
        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        SqlState::QUERY_CANCELED,
        SqlState::LOCK_NOT_AVAILABLE,
    ]
    .iter()
    .any(|c| e.code() == Some(c))
}

impl Tracker {
    /// Starts tracking the entity's rows on `side`; `Ok(Err(why))` when this shard cannot be
    /// tracked (not `wal_level = logical`, no free slot, the mover may not decode or publish
    /// there, a replica identity that does not cover the key).
    pub async fn start(
        side: &Side,
        move_id: i64,
        tables: &[EntityTable],
        entity: &shard_directory_protocol::EntityKey,
        patience: Duration,
    ) -> Result<Result<Tracker, String>, Error> {
        let shard = side.name().to_owned();
        let client = side.another(move_id).await?;
        let described = catalog::describe(&client, &entity.entity_type)
            .await
            .at(Step::Track, shard.as_str())?;
        if let Some(gap) = described.iter().find_map(|t| t.identity_gaps.first()) {
            return Ok(Err(format!(
                "the replica identity of {} on shard {shard} does not cover the key column",
                gap.name
            )));
        }
        let slot = name(move_id);
        // Both wait behind the shard's transactions (the publication for a lock on each table,
        // the slot for every transaction in progress): bounded, then the freeze compares all.
        let bound = patience.as_millis().max(1);
        let started = async {
            client
                .batch_execute(&format!(
                    "SET lock_timeout = {bound}; SET statement_timeout = {bound}"
                ))
                .await?;
            logical::drop_publication(&client, &slot).await?;
            logical::create_publication(
                &client,
                &slot,
                tables,
                &entity.entity_id,
                logical::Publish::Tracking,
            )
            .await?;
            client
                .execute(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput', true)",
                    &[&slot],
                )
                .await?;
            client
                .batch_execute("SET lock_timeout = 0; SET statement_timeout = 0")
                .await
        }
        .await;
        match started {
            Ok(()) => Ok(Ok(Tracker {
                client,
                shard,
                slot,
                relations: HashMap::new(),
            })),
            Err(e) if untrackable(&e) => Ok(Err(format!(
                "shard {shard} cannot stream the entity's changes to the mover: {}",
                e.as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_owned())
            ))),
            Err(e) => Err(e).at(Step::Track, shard.as_str()),
        }
    }

    /// Reads the stream into `into`, up to every transaction committed before the call.
    pub async fn drain(&mut self, tables: &[EntityTable], into: &mut Changed) -> Result<(), Error> {
        const BATCH: usize = 10_000;
        // A transaction committed without waiting for its WAL to be flushed (synchronous_commit
        // off) is decoded only once flushed: this flushes it.
        let upto = logical::catchup_position(&self.client)
            .await
            .at(Step::Track, self.shard.as_str())?;
        loop {
            let rows = self
                .client
                .query(
                    "SELECT data FROM pg_logical_slot_get_binary_changes($1::text::name, $2::text::pg_lsn, $3, \
                     'proto_version', '1', 'publication_names', $1::text)",
                    &[&self.slot, &upto, &(BATCH as i32)],
                )
                .await
                .at(Step::Track, self.shard.as_str())?;
            for row in &rows {
                let message = pgoutput::parse(row.get(0)).map_err(|m| Error::Stream {
                    shard: self.shard.clone(),
                    slot: self.slot.clone(),
                    why: m.0,
                })?;
                self.note(message, tables, into);
            }
            if rows.len() < BATCH {
                return Ok(());
            }
        }
    }

    fn note(&mut self, message: Message, tables: &[EntityTable], into: &mut Changed) {
        let table_of = |relations: &HashMap<u32, Relation>, id: u32| {
            let name = &relations.get(&id)?.name;
            tables.iter().find(|t| &t.name == name)
        };
        match message {
            Message::Relation(r) => {
                self.relations.insert(r.id, r);
            }
            Message::Truncate(ids) => {
                for id in ids {
                    if let Some(t) = table_of(&self.relations, id) {
                        into.all(&t.name);
                    }
                }
            }
            Message::Row { relation, tuples } => {
                let Some(t) = table_of(&self.relations, relation) else {
                    return;
                };
                let r = &self.relations[&relation];
                match primary_key_positions(t, r) {
                    None => into.all(&t.name),
                    Some(positions) => {
                        for tuple in tuples {
                            let key: Option<Vec<String>> = positions
                                .iter()
                                .map(|&i| match tuple.get(i) {
                                    Some(Value::Text(v)) => Some(v.clone()),
                                    _ => None,
                                })
                                .collect();
                            match key {
                                Some(key) => into.key(&t.name, key),
                                None => into.all(&t.name),
                            }
                        }
                    }
                }
            }
            Message::Other => {}
        }
    }
}

/// Where the stream's tuples of `r` carry the primary key of `t`, in its column order: only
/// when the replica identity is that key (the stream then sends it with every change).
fn primary_key_positions(t: &EntityTable, r: &Relation) -> Option<Vec<usize>> {
    if !matches!(r.identity, b'd' | b'i') || t.primary_key.is_empty() {
        return None;
    }
    let identity: BTreeSet<&str> = r
        .columns
        .iter()
        .filter(|(_, key)| *key)
        .map(|(n, _)| n.as_str())
        .collect();
    let names: Vec<&str> = t
        .primary_key
        .iter()
        .map(|q| {
            t.columns
                .iter()
                .find(|c| &c.quoted == q)
                .map(|c| c.name.as_str())
        })
        .collect::<Option<_>>()?;
    if identity != names.iter().copied().collect() {
        return None;
    }
    names
        .iter()
        .map(|n| r.columns.iter().position(|(c, _)| c == n))
        .collect()
}

/// Both shards' trackers and what they found changed, with what the online check found
/// different.
pub(crate) struct Tracking {
    pub source: Tracker,
    pub target: Tracker,
    pub changed: Changed,
}

impl Tracking {
    pub async fn drain(&mut self, tables: &[EntityTable]) -> Result<(), Error> {
        self.source.drain(tables, &mut self.changed).await?;
        self.target.drain(tables, &mut self.changed).await
    }
}

/// Drops the tracking publication of move `move_id` on a shard (its slot went with its session).
pub(crate) async fn drop(client: &Client, move_id: i64) -> Result<(), tokio_postgres::Error> {
    logical::drop_publication(client, &name(move_id)).await
}
