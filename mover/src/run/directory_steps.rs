//! The directory's side of a freeze, a thaw, the cutover and an abort: each step is committed in
//! one directory transaction with the record's phase, so the entry and the record never disagree.

use std::time::Duration;

use shard_directory_protocol::State;

use crate::directory::entry::{self, Placement};
use crate::directory::phase::Phase;
use crate::directory::record;
use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::shards::fence;

use super::Run;

/// How long the source's cutover fence may wait for the shard's checked transactions in flight:
/// the directory's version lock, which every directory writer needs, is held meanwhile.
pub(super) const CUTOVER_FENCE_WAIT: Duration = Duration::from_millis(300);

/// The directory steps a move makes, each committed with the record's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DirectoryStep {
    Freeze,
    /// Undoes a freeze the source's fence never joined: back to migrating, the copy kept.
    Thaw,
    Complete,
    Abort,
}

impl Run<'_> {
    /// Runs a directory step unless the entry is already past it, and records `phase` (and the
    /// step's version) in the same directory transaction, which first locks the move's row (as
    /// `release_expired_freeze` does) and checks its phase is still this run's.
    pub(super) async fn directory_step(
        &mut self,
        step: DirectoryStep,
        phase: Phase,
    ) -> Result<(), Error> {
        let (id, key, from) = (self.record.move_id, self.key.clone(), self.record.phase);
        let (source, target) = (
            self.record.source_shard.clone(),
            self.record.target_shard.clone(),
        );
        let lease = self.lease();
        let err_step = match step {
            DirectoryStep::Freeze | DirectoryStep::Thaw => Step::Freeze,
            DirectoryStep::Complete => Step::Cutover,
            DirectoryStep::Abort => Step::Abort,
        };
        let at = |e| Error::Db {
            step: err_step,
            place: Place::Directory,
            source: e,
        };
        let tx = self.directory.transaction().await.map_err(at)?;
        let (locked, lease_running) = record::lock(&tx, id).await.map_err(at)?;
        if locked != from {
            drop(tx);
            self.reload().await?;
            return Err(self.moved_on(from));
        }
        if step == DirectoryStep::Complete && !lease_running {
            return Err(Error::LeaseExpired);
        }
        let entry = entry::read(&tx, &key)
            .await
            .at(err_step, Place::Directory)?;
        let toward_target = |e: &Placement| {
            e.shard_name == source && e.target_shard.as_deref() == Some(target.as_str())
        };
        let calls: &[&str] = match (step, &entry) {
            (DirectoryStep::Freeze, Some(e)) if e.state == State::Migrating && toward_target(e) => {
                &["SELECT shard_directory.freeze($1, $2)"]
            }
            (DirectoryStep::Freeze, Some(e)) if e.state == State::ReadOnly && toward_target(e) => {
                &[]
            }
            (DirectoryStep::Thaw, Some(e)) if e.state == State::ReadOnly && toward_target(e) => &[
                "SELECT shard_directory.abort_move($1, $2)",
                "SELECT shard_directory.begin_move($1, $2, $3)",
            ],
            (DirectoryStep::Thaw, Some(e)) if e.state == State::Migrating && toward_target(e) => {
                &[]
            }
            (DirectoryStep::Complete, Some(e))
                if e.state == State::ReadOnly && toward_target(e) =>
            {
                &["SELECT shard_directory.complete_move($1, $2)"]
            }
            (DirectoryStep::Complete, Some(e))
                if e.state == State::Active && e.shard_name == target =>
            {
                &[]
            }
            (DirectoryStep::Abort, Some(e)) if e.state != State::Active && toward_target(e) => {
                &["SELECT shard_directory.abort_move($1, $2)"]
            }
            (DirectoryStep::Abort, Some(e))
                if e.state == State::Active && e.shard_name == source =>
            {
                &[]
            }
            (_, other) => {
                return Err(Error::State {
                    move_id: id,
                    phase: self.record.phase,
                    why: format!(
                        "the directory entry of {key} is {}, which this move did not leave it in; \
                         someone changed it by hand",
                        other.as_ref().map_or("missing".to_owned(), |e| format!(
                            "{} on {} (target {})",
                            e.state,
                            e.shard_name,
                            e.target_shard.as_deref().unwrap_or("none")
                        ))
                    ),
                })
            }
        };
        let mut version = entry.map_or(0, |e| e.version);
        for sql in calls {
            let row = if sql.contains("$3") {
                tx.query_one(*sql, &[&key.entity_type, &key.entity_id, &target])
                    .await
            } else {
                tx.query_one(*sql, &[&key.entity_type, &key.entity_id])
                    .await
            };
            version = row.map_err(at)?.get(0);
        }
        match step {
            DirectoryStep::Freeze => {
                record::set_versions(&tx, id, Some(version), None)
                    .await
                    .map_err(at)?;
                record::start_freeze(&tx, id, lease).await.map_err(at)?;
            }
            DirectoryStep::Thaw => record::end_freeze(&tx, id).await.map_err(at)?,
            DirectoryStep::Complete => {
                if !calls.is_empty() {
                    // Before the target can be written (this commit), the source stops serving
                    // reads too, for what is left of the lease: `version` is taken and the
                    // directory's version lock held, so past the lease only clients that saw
                    // this cutover, or the abort of one that never committed, get through.
                    let left = record::lease_left(&tx, id).await.map_err(at)?;
                    // A source that does not answer (a network partition) is given up on in
                    // time, and the transaction rolled back.
                    let limit = left.min(CUTOVER_FENCE_WAIT * 4);
                    point!("fence.cutover.source");
                    let source_fence = &mut self.source.client;
                    let fenced = tokio::time::timeout(
                        limit,
                        fence::cutover(source_fence, &key, left, version, CUTOVER_FENCE_WAIT),
                    )
                    .await
                    .map_err(|_| Error::Timeout {
                        step: Step::Cutover,
                        what: format!("shard {source} to take the cutover's fence"),
                        after: limit,
                    })?;
                    fenced.map_err(|e| Error::Db {
                        step: Step::Cutover,
                        place: Place::Shard(source.clone()),
                        source: e,
                    })?;
                    // The lease ran on meanwhile: past it, a router may be about to release
                    // the entity (it waits for this row): no cutover then.
                    if record::lease_left(&tx, id).await.map_err(at)?.is_zero() {
                        return Err(Error::LeaseExpired);
                    }
                }
                record::set_versions(&tx, id, None, Some(version))
                    .await
                    .map_err(at)?;
                if let Some(reversible) = self.record.reverses {
                    let (from, to) = (Phase::Reversible, Phase::Reverted);
                    if !record::set_phase(&tx, reversible, from, to)
                        .await
                        .map_err(at)?
                    {
                        return Err(Error::State {
                            move_id: id,
                            phase: self.record.phase,
                            why: format!(
                                "move {reversible}, which this one reverts, is no longer reversible \
                                 (finalized meanwhile?)"
                            ),
                        });
                    }
                }
            }
            DirectoryStep::Abort => {}
        }
        if !record::set_phase(&tx, id, from, phase).await.map_err(at)? {
            unreachable!("the move's row is locked by this transaction");
        }
        point!("directory.{:?}", step);
        tx.commit().await.map_err(at)?;
        self.entered().await
    }
}
