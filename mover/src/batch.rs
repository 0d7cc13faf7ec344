//! Many moves from one plan ([`crate::balance`]): the fleet a plan is made from (shards, entries,
//! sizes), and a plan run with at most `parallel` moves at once and `per_shard` per shard.
//!
//! A run reads the directory before each move, so running a plan again after the mover was
//! killed picks up where it stopped: a move already done is skipped, a move left open (to the
//! same target) is resumed, and an entity that is no longer where the plan found it is skipped
//! and said so.

use std::collections::BTreeMap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use shard_directory_protocol::State;

use crate::balance::{Fleet, Placed, PlannedMove, ShardInfo};
use crate::entry;
use crate::error::{At, Error, Failure, Place, Step};
use crate::mover::Mover;
use crate::record::MoveRecord;
use crate::side::Side;
use crate::sizes;

/// How a plan's moves run.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Moves at once.
    pub parallel: usize,
    /// Moves at once that one shard takes part in (as source or target).
    pub per_shard: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            parallel: 1,
            per_shard: 1,
        }
    }
}

/// What became of one planned move.
#[derive(Debug)]
pub enum Outcome {
    Moved(Box<MoveRecord>),
    /// Not run, and why (already there, moved elsewhere, no entry).
    Skipped(String),
    Failed(Box<Failure>),
}

/// Whether a planned move is to start, to resume (an open move of it to the same target), or
/// to skip.
enum Next {
    Start,
    Resume(i64),
    Skip(String),
}

impl Mover {
    /// The shards, every active entry, and each entity's size on its shard (see
    /// `sizes.rs`), with its load when `load` (the shards' `entity_stats()`, which a shard
    /// of extension 0.1.0 lacks): what `drain`, `split` and `rebalance` plan from.
    pub async fn fleet(&self, load: bool) -> Result<Fleet, Error> {
        let directory = self.connect_directory(None).await?;
        let shards: Vec<ShardInfo> = directory
            .query(
                "SELECT shard_name, region FROM shard_directory.shards ORDER BY shard_name",
                &[],
            )
            .await
            .at(Step::Plan, Place::Directory)?
            .iter()
            .map(|r| ShardInfo {
                name: r.get(0),
                region: r.get(1),
            })
            .collect();
        let rows = directory
            .query(
                "SELECT entity_type, entity_id, shard_name, region \
                 FROM shard_directory.shard_directory WHERE state = 'active' \
                 ORDER BY shard_name, entity_type, entity_id",
                &[],
            )
            .await
            .at(Step::Plan, Place::Directory)?;
        let mut by_shard: BTreeMap<String, Vec<Placed>> = BTreeMap::new();
        for r in &rows {
            let shard: String = r.get(2);
            by_shard.entry(shard.clone()).or_default().push(Placed {
                key: crate::EntityKey::new(r.get::<_, String>(0), r.get::<_, String>(1)),
                shard,
                region: r.get(3),
                size: Default::default(),
            });
        }
        let mut entities = Vec::new();
        for (shard, mut placed) in by_shard {
            let mut types: Vec<String> = placed.iter().map(|p| p.key.entity_type.clone()).collect();
            types.dedup();
            let side = self.connect_shard(&directory, &shard).await?;
            let sizes = sizes::on_shard(&side.client, &shard, &types, load).await?;
            for p in &mut placed {
                p.size = sizes.get(&p.key).copied().unwrap_or_default();
            }
            entities.extend(placed);
        }
        Ok(Fleet { shards, entities })
    }

    pub(crate) async fn connect_shard(
        &self,
        directory: &tokio_postgres::Client,
        shard: &str,
    ) -> Result<Side, Error> {
        let endpoint = crate::registry::endpoint(directory, &self.overrides, shard).await?;
        Side::connect(endpoint, None).await
    }

    /// Runs `moves`, at most `options.parallel` at once and `options.per_shard` per shard, in
    /// the plan's order as capacity frees up; a failed move does not stop the others. Returns
    /// each move with its outcome, in the plan's order.
    pub async fn run_batch(
        &self,
        moves: &[PlannedMove],
        options: BatchOptions,
    ) -> Result<Vec<(PlannedMove, Outcome)>, Error> {
        let directory = self.connect_directory(None).await?;
        let open = self.list(true, None).await?;
        let mut outcomes: Vec<Option<Outcome>> = moves.iter().map(|_| None).collect();
        let mut pending: Vec<(usize, Next)> = Vec::new();
        for (i, m) in moves.iter().enumerate() {
            let key = m.key();
            let entry = entry::read(&directory, &key)
                .await
                .at(Step::Plan, Place::Directory)?;
            let next = match entry {
                None => Next::Skip(format!("no directory entry for {key}")),
                Some(e) if e.state == State::Active && e.shard_name == m.to => {
                    Next::Skip(format!("{key} is on {} already", m.to))
                }
                Some(e) if e.state == State::Active && e.shard_name == m.from => Next::Start,
                Some(e) if e.state == State::Active => Next::Skip(format!(
                    "{key} is on {}, not on {} as planned",
                    e.shard_name, m.from
                )),
                Some(e) => match open.iter().find(|r| {
                    r.entity_type == key.entity_type
                        && r.entity_id == key.entity_id
                        && r.target_shard == m.to
                }) {
                    Some(r) => Next::Resume(r.move_id),
                    None => Next::Skip(format!(
                        "{key} is {} toward {}: a move not in this plan is under way",
                        e.state,
                        e.target_shard.as_deref().unwrap_or("?")
                    )),
                },
            };
            match next {
                Next::Skip(why) => outcomes[i] = Some(Outcome::Skipped(why)),
                next => pending.push((i, next)),
            }
        }
        let mut busy: BTreeMap<&str, usize> = BTreeMap::new();
        let mut running = FuturesUnordered::new();
        let (parallel, per_shard) = (options.parallel.max(1), options.per_shard.max(1));
        loop {
            while running.len() < parallel {
                let free = |shard: &str| busy.get(shard).copied().unwrap_or(0) < per_shard;
                let Some(at) = pending
                    .iter()
                    .position(|(i, _)| free(&moves[*i].from) && free(&moves[*i].to))
                else {
                    break;
                };
                let (i, next) = pending.remove(at);
                let m = &moves[i];
                for shard in [m.from.as_str(), m.to.as_str()] {
                    *busy.entry(shard).or_default() += 1;
                }
                running.push(async move {
                    let result = match next {
                        Next::Resume(id) => self.resume(id).await,
                        _ => self.start(&m.key(), &m.to).await,
                    };
                    (i, result)
                });
            }
            let Some((i, result)) = running.next().await else {
                break;
            };
            let m = &moves[i];
            for shard in [m.from.as_str(), m.to.as_str()] {
                *busy.get_mut(shard).expect("counted") -= 1;
            }
            outcomes[i] = Some(match result {
                Ok(record) => Outcome::Moved(Box::new(record)),
                Err(failure) => Outcome::Failed(Box::new(failure)),
            });
        }
        Ok(moves
            .iter()
            .cloned()
            .zip(
                outcomes
                    .into_iter()
                    .map(|o| o.expect("every move ran or was skipped")),
            )
            .collect())
    }
}
