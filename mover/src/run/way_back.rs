//! The way back of a reversible move (`run/replication/logical.rs`): a publication and slot on the move's target
//! that a subscription on its source reads, joining the two shards until `finalize` or `revert`.
//! A shard it joins is not drained: decommissioned, it would leave the slot on the other shard
//! keeping WAL without bound (or a subscription reading a slot that is gone), and the move could
//! be neither reverted nor finalized. And a finalize whose source is gone drops what it can,
//! the target's slot and publication, so the target's WAL is released, and ends the move,
//! saying what it left on the source.

use std::fmt;

use shard_directory_protocol::EntityKey;

use crate::directory::phase::Phase;
use crate::directory::record::{self, MoveRecord};
use crate::directory::registry;
use crate::error::{At, Error, Failure, Place, Step};
use crate::failpoint::point;
use crate::mover::Mover;
use crate::run::replication::logical;
use crate::shards::side::Side;

use super::Run;

/// A reversible move not finished yet, whose way back joins its two shards (or will).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WayBack {
    pub move_id: i64,
    pub entity: EntityKey,
    /// The move's source: where the way back carries the rows to (its subscription).
    pub source: String,
    /// The move's target: where the way back starts (its publication and slot).
    pub target: String,
    pub phase: Phase,
    /// `finalize` was asked and has not finished.
    pub finalizing: bool,
}

impl From<&MoveRecord> for WayBack {
    fn from(r: &MoveRecord) -> WayBack {
        WayBack {
            move_id: r.move_id,
            entity: r.entity(),
            source: r.source_shard.clone(),
            target: r.target_shard.clone(),
            phase: r.phase,
            finalizing: r.finalized_at.is_some(),
        }
    }
}

impl fmt::Display for WayBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "move {} of {} ({} -> {}, {}{})",
            self.move_id,
            self.entity,
            self.source,
            self.target,
            self.phase,
            if self.finalizing { ", finalizing" } else { "" }
        )
    }
}

impl WayBack {
    /// What ends it, for a person.
    pub fn fix(&self) -> String {
        let id = self.move_id;
        if self.finalizing {
            format!("`shard-directory finalize {id}` finishes its finalize")
        } else if self.phase == Phase::Reversible {
            format!(
                "`shard-directory finalize {id}` (keeps {} on {}) or `shard-directory revert {id}` \
                 (takes it back to {})",
                self.entity, self.target, self.source
            )
        } else if self.phase.can_abort() {
            format!(
                "`shard-directory abort {id}`, or let it finish (`shard-directory resume {id}`) and \
                 finalize it"
            )
        } else {
            format!("`shard-directory resume {id}`, then finalize or revert it")
        }
    }
}

/// Every reversible move that is not finished (its way back made, or to be made), from the
/// directory `c`.
pub(crate) async fn open(c: &tokio_postgres::Client) -> Result<Vec<WayBack>, Error> {
    let open = record::list(c, true, None)
        .await
        .at(Step::Plan, Place::Directory)?;
    Ok(open
        .iter()
        .filter(|r| r.reversible)
        .map(WayBack::from)
        .collect())
}

/// Refuses a drain of `shard` while a way back of `ways` joins it to another shard.
pub(crate) fn refuse_drain(shard: &str, ways: &[WayBack]) -> Result<(), Error> {
    let joining: Vec<WayBack> = ways
        .iter()
        .filter(|w| w.source == shard || w.target == shard)
        .cloned()
        .collect();
    if joining.is_empty() {
        return Ok(());
    }
    Err(Error::WayBackJoins {
        shard: shard.to_owned(),
        moves: joining,
    })
}

/// Whether an error reaching `shard` says it is gone (not in the registry, or without a
/// conninfo) or does not answer, rather than that it refused the mover (a password, a
/// privilege) or that the directory did not answer.
fn gone(error: &Error, shard: &str) -> bool {
    match error {
        Error::Preflight { .. } => true,
        Error::Db {
            place: Place::Shard(s),
            ..
        } => s == shard && error.lost_connection(),
        _ => false,
    }
}

impl Mover {
    /// Why the source of move `move_id` cannot be reached, if it is [`gone`].
    pub(crate) async fn source_gone(
        &self,
        directory: &tokio_postgres::Client,
        move_id: i64,
    ) -> Result<Option<Error>, Error> {
        let record = record::load(directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        let shard = &record.source_shard;
        let reached = match registry::endpoint(directory, &self.overrides, shard).await {
            Ok(endpoint) => Side::connect(endpoint, Some(move_id)).await.map(drop),
            Err(e) => Err(e),
        };
        match reached {
            Ok(()) => Ok(None),
            Err(e) if gone(&e, shard) => Ok(Some(e)),
            Err(e) => Err(e),
        }
    }

    /// Finalizes reversible move `move_id` (its record already finalizing) without its source,
    /// which cannot be reached (`why`): the way back's slot and publication dropped on the
    /// target, and the move `done` with its source's rows kept, as `--keep-source` keeps them.
    /// What is left on the source is said (a note, and the record's `last_error`): the way
    /// back's subscription, which `cleanup` drops, and the entity's rows, fenced `moved`, which
    /// `purge-source` deletes, once it answers again.
    pub(crate) async fn finalize_without_source(
        &self,
        move_id: i64,
        why: Error,
    ) -> Result<MoveRecord, Failure> {
        self.without_source(move_id, why)
            .await
            .map_err(|e| crate::mover::not_opened(move_id, e))
    }

    async fn without_source(&self, move_id: i64, why: Error) -> Result<MoveRecord, Error> {
        let directory = self.connect_directory(Some(move_id)).await?;
        self.lock_move(&directory, move_id).await?;
        let loaded = record::load(&directory, move_id).await;
        let record = loaded
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        let moved_on = |why: &str| Error::State {
            move_id,
            phase: record.phase,
            why: why.to_owned(),
        };
        if record.phase != Phase::CleaningUp || record.finalized_at.is_none() {
            return Err(moved_on(
                "it is not being finalized (another process moved it on)",
            ));
        }
        let name = logical::way_back_name(move_id);
        let endpoint = registry::endpoint(&directory, &self.overrides, &record.target_shard);
        let target = Side::connect(endpoint.await?, Some(move_id)).await?;
        point!("way_back.drop_without_source");
        logical::drop_publication(&target.client, &name)
            .await
            .at(Step::WayBack, target.name())?;
        let (source, key) = (&record.source_shard, record.entity());
        let left = format!(
            "finalized without shard {source} ({why}): the way back's slot and publication on \
             shard {} are dropped; left on shard {source}: subscription {name} (`shard-directory \
             cleanup` drops it once the shard answers) and the rows of {key}, fenced moved \
             (`shard-directory purge-source {move_id}` deletes them; nothing to do if the shard \
             is decommissioned)",
            target.name()
        );
        point!("finalize.without_source");
        let finished = record::finish_without_source(&directory, move_id, &left).await;
        if !finished.at(Step::Record, Place::Directory)? {
            return Err(moved_on(
                "another process moved it on while its way back was dropped",
            ));
        }
        self.observer.note(move_id, &left);
        let done = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .expect("a move record is never deleted");
        self.observer.phase(move_id, done.phase).await;
        Ok(done)
    }
}

impl Run<'_> {
    /// `--reversible`: the way back, made before the freeze (its slot waits for the target's
    /// transactions in progress, which must not be under the freeze) and left off until the
    /// forward replication is gone.
    pub(super) async fn ensure_way_back(&self) -> Result<(), Error> {
        let (id, step) = (self.id(), Step::WayBack);
        let name = logical::way_back_name(id);
        let target = self.target(step)?;
        let (from, to) = (&self.record.target_shard, &self.record.source_shard);
        let signature = logical::way_back_signature(id, &self.key, from, to);
        let (tables, entity_id) = (&self.tables, &self.key.entity_id);
        logical::ensure_publication(&target.client, &name, tables, entity_id, &signature)
            .await
            .map_err(|t| {
                self.replication_trouble(step, (from, to), t, "the way back's publication")
            })?;
        logical::ensure_subscription(
            &target.client,
            &self.source.client,
            &name,
            &target.endpoint.replication_conninfo,
            &signature,
            self.options.fence_patience,
            logical::Begin::Off,
        )
        .await
        .map_err(|t| {
            let what = format!("creating replication slot {name}");
            self.replication_trouble(step, (from, to), t, &what)
        })
    }

    /// After the cutover, the forward replication dropped: the way back turned on, and the move
    /// reversible (until `reversible_until`, when it has one).
    pub(super) async fn open_way_back(&mut self) -> Result<(), Error> {
        let name = logical::way_back_name(self.id());
        point!("way_back.open");
        logical::enable_subscription(&self.source.client, &name)
            .await
            .at(Step::WayBack, self.source.name())?;
        self.enter(Phase::Reversible).await
    }

    /// Drops the way back, when the move is reversible: its subscription on the source, its
    /// slot and publication on the target.
    pub(super) async fn drop_way_back(&self, step: Step) -> Result<(), Error> {
        if !self.record.reversible {
            return Ok(());
        }
        let name = logical::way_back_name(self.id());
        point!("way_back.drop.{:?}", step);
        logical::drop_subscription(&self.source.client, &name)
            .await
            .at(step, self.source.name())?;
        let target = self.target(step)?;
        logical::drop_publication(&target.client, &name)
            .await
            .at(step, target.name())
    }
}
