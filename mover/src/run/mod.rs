//! One process driving one move, phase by phase. Each step reads the real state and may run
//! twice, and a phase is written only from the phase this run believes the move is in. An error
//! while the entity is frozen aborts the move, as does a replication slot that keeps too much
//! WAL; any other leaves it resumable. Whether to abort is decided from the record as the
//! directory has it then, never from this run's copy of it.
//!
//! A freeze is the directory's first (its version, `F`, is what the source's fence admits
//! clients above once its lease ends), then the source's fence, with a lease: a mover that
//! vanishes mid-freeze leaves its entity writable again once the lease ends (routers release
//! the directory's side, `release_expired_freeze`), and a mover that was only slow finds at
//! its cutover that the lease ended and aborts instead.
//!
//! This file is the state machine: which phase follows which ([`Run::step`]), what is recorded
//! on entering one, what a failure leaves. Each phase's work lives beside it: `replication/`
//! (`copying`, `catching_up`), `checks/`, `freeze`, `copy/`, `cutover/`, `cleanup/`, `abort`,
//! `way_back`, with `directory_steps` (the directory's side of each) and `schema` (DDL
//! meanwhile).

mod abort;
pub(crate) mod checks;
pub(crate) mod cleanup;
pub(crate) mod copy;
pub(crate) mod cutover;
mod directory_steps;
mod freeze;
pub(crate) mod replication;
pub(crate) mod schema;
pub(crate) mod way_back;

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::directory::phase::Phase;
use crate::directory::record::{self, Method, MoveRecord};
use crate::directory::registry;
use crate::error::{At, Error, Failure, Left, Place, Step};
use crate::failpoint::point;
use crate::mover::Mover;
use crate::options::MoveOptions;
use crate::report::observer::Observer;
use crate::report::progress::Rates;
use crate::run::checks::tracking::Tracking;
use crate::shards::catalog::EntityTable;
use crate::shards::fence::Fence;
use crate::shards::side::Side;

pub(crate) fn stopped(move_id: i64, error: Error, phase: Option<Phase>) -> Failure {
    Failure {
        move_id: Some(move_id),
        error,
        left: Left::Resumable,
        phase,
        abort_error: None,
    }
}

/// A move that ended aborted for `why`: the entity is active on its source.
pub(crate) fn aborted(move_id: i64, why: &str) -> Failure {
    Failure {
        move_id: Some(move_id),
        error: Error::State {
            move_id,
            phase: Phase::Aborted,
            why: format!("the move did not happen: {why}"),
        },
        left: Left::Aborted,
        phase: Some(Phase::Aborted),
        abort_error: None,
    }
}

/// One process driving one move.
pub(crate) struct Run<'m> {
    /// Where the directory and the shards are: a run connects again after losing a connection.
    mover: &'m Mover,
    options: &'m MoveOptions,
    observer: Arc<dyn Observer>,
    directory: Client,
    pub(crate) record: MoveRecord,
    key: EntityKey,
    source: Side,
    /// The target, or why it could not be reached: an abort still releases the entity without it.
    target: Result<Side, String>,
    tables: Vec<EntityTable>,
    /// The definitions of the entity's tables this run began with: DDL made since stops the move
    /// (`run/schema.rs`).
    schema: schema::Watch,
    /// When the freeze must be over; set when this run froze the entity or resumed it frozen.
    deadline: Option<Instant>,
    /// Whether this run froze the source itself (a resumed freeze fences it again first).
    fenced_here: bool,
    /// Whether this run caught up and verified under the freeze (a move resumed at `verified`
    /// is verified again: nothing says its source stayed frozen while no mover ran).
    verified_here: bool,
    /// Whether this run turned the subscription back on after it stopped on an error.
    reenabled: bool,
    /// Whether this run's abort has released the entity (its directory entry restored).
    released: bool,
    /// Whether a statement this run gave up on may still run on its shard sessions: what undoes
    /// the move then runs on new ones.
    stale_sessions: bool,
    /// The entity's changes on both shards since this run's online check (logical method).
    tracking: Option<Tracking>,
    /// Why the entity's changes could not be tracked: the freeze compares every row.
    untracked: Option<String>,
    /// Freezes this run undid after they ran past `max_freeze`.
    freezes_undone: u32,
    /// How fast each table's rows are copied or deleted.
    rates: Rates,
}

/// Where a move goes back to when its freeze is undone with the copy kept.
fn thawed(method: Method) -> Phase {
    match method {
        Method::Logical => Phase::CatchingUp,
        Method::Copy => Phase::Migrating,
    }
}

fn max_freeze(record: &MoveRecord) -> Duration {
    Duration::from_millis(record.max_freeze_ms.max(0) as u64)
}

impl<'m> Run<'m> {
    pub(crate) fn new(
        mover: &'m Mover,
        options: &'m MoveOptions,
        directory: Client,
        record: MoveRecord,
        source: Side,
        target: Result<Side, String>,
        tables: Vec<EntityTable>,
    ) -> Run<'m> {
        let key = record.entity();
        Run {
            mover,
            options,
            observer: mover.observer.clone(),
            directory,
            record,
            key,
            source,
            target,
            schema: schema::Watch::new(&tables),
            tables,
            deadline: None,
            fenced_here: false,
            verified_here: false,
            reenabled: false,
            released: false,
            stale_sessions: false,
            tracking: None,
            untracked: None,
            freezes_undone: 0,
            rates: Rates::default(),
        }
    }

    fn id(&self) -> i64 {
        self.record.move_id
    }

    /// How long a freeze holds without a mover to end it: `--max-freeze` (the mover aborts
    /// itself then) and the grace for a mover that can no longer do even that.
    fn lease(&self) -> Duration {
        max_freeze(&self.record) + self.options.lease_grace
    }

    fn target(&self, step: Step) -> Result<&Side, Error> {
        self.target.as_ref().map_err(|cause| Error::Unreachable {
            step,
            shard: self.record.target_shard.clone(),
            cause: cause.clone(),
        })
    }

    /// Runs the move to its end. A move that ends aborted (a lease that ran out, another
    /// process's abort, a resumed abort) did not move the entity: that is a failure, never a
    /// success.
    pub(crate) async fn drive(mut self) -> Result<MoveRecord, Failure> {
        loop {
            let result = match self.record.phase {
                Phase::Done | Phase::Reverted | Phase::Reversible => return Ok(self.record),
                Phase::Aborted => return Err(self.ended_aborted()),
                Phase::Aborting => self.abort().await,
                phase => self.step(phase).await,
            };
            if let Err(error) = result {
                return Err(self.fail(error).await);
            }
        }
    }

    /// A move found aborted where it was to move the entity: why, from its record.
    fn ended_aborted(&self) -> Failure {
        let why = self.record.last_error.as_deref().unwrap_or(
            "it was aborted (by `shard-directory abort`, or by a process that stopped it)",
        );
        aborted(self.id(), why)
    }

    /// How an abort that stopped on `error` leaves the move.
    pub(crate) fn failure(&self, error: Error) -> Failure {
        Failure {
            move_id: Some(self.id()),
            error,
            left: if self.released {
                Left::Released
            } else {
                Left::Resumable
            },
            phase: Some(self.record.phase),
            abort_error: None,
        }
    }

    /// Records the error; a move that holds the entity frozen (or whose slot keeps too much WAL)
    /// aborts itself, so the entity is writable again on its source.
    async fn fail(&mut self, error: Error) -> Failure {
        let id = self.id();
        // Best effort: the directory may be what failed; the error is returned either way.
        let _ = record::set_error(&self.directory, id, &error.to_string()).await;
        self.observer.note(id, &format!("failed: {error}"));
        // This run's copy of the record may be behind the directory (a step committed, its
        // reload failed): decide from the directory's, or not at all.
        if self.reload().await.is_err() {
            return stopped(id, error, Some(self.record.phase));
        }
        let phase = self.record.phase;
        let frozen = matches!(phase, Phase::Frozen | Phase::Verified);
        let slot_at_risk = matches!(error, Error::SlotLag { .. });
        let must_abort =
            phase == Phase::Aborting || (phase.can_abort() && (frozen || slot_at_risk));
        if !must_abort {
            return stopped(id, error, Some(phase));
        }
        // A statement cut off (by the freeze's deadline, a timeout) may still run on the shards'
        // sessions: the abort runs on new ones, once the directory has released the entity.
        self.stale_sessions = true;
        match self.abort().await {
            Ok(()) => Failure {
                move_id: Some(id),
                error,
                left: Left::Aborted,
                phase: Some(self.record.phase),
                abort_error: None,
            },
            Err(abort_error) => Failure {
                abort_error: Some(abort_error),
                ..self.failure(error)
            },
        }
    }

    async fn step(&mut self, phase: Phase) -> Result<(), Error> {
        match (phase, self.record.method) {
            (Phase::Migrating, method) => {
                self.fence_target_during_move().await?;
                match method {
                    Method::Logical => self.enter(Phase::Copying).await,
                    Method::Copy => self.freeze().await,
                }
            }
            (Phase::Copying, _) => {
                self.replicate().await?;
                self.enter(Phase::CatchingUp).await
            }
            (Phase::CatchingUp, _) => {
                self.wait_for_small_lag().await?;
                if self.options.online_check && self.tracking.is_none() && self.untracked.is_none()
                {
                    self.observer.step(self.id(), Step::Verify).await;
                    self.check_online().await?;
                }
                if self.tracking.is_some() {
                    self.estimate_freeze().await?;
                }
                self.observer.step(self.id(), Step::Freeze).await;
                self.freeze().await
            }
            (Phase::Frozen, method) => match self.catch_up_and_verify().await {
                Err(e @ Error::FreezeExceeded { .. })
                    if method == Method::Logical
                        && self.freezes_undone + 1 < self.options.freeze_attempts =>
                {
                    self.unfreeze(e).await
                }
                checked => {
                    self.unless_ddl(checked).await?;
                    self.enter(Phase::Verified).await
                }
            },
            (Phase::Verified, _) => self.cutover().await,
            (Phase::Cutover, _) => {
                let version = self.record.cutover_version.expect("set with the cutover");
                let moved = Fence::Moved {
                    moved_to: self.record.target_shard.clone(),
                    version,
                };
                self.set_fence_patiently(&self.source, &moved, Step::FenceSource)
                    .await?;
                self.enter(Phase::CleaningUp).await
            }
            (Phase::CleaningUp, _) => {
                self.drop_replication(Step::DropReplication).await?;
                if self.record.reversible && self.record.finalized_at.is_none() {
                    return self.open_way_back().await;
                }
                self.drop_way_back(Step::DropReplication).await?;
                if !self.record.keep_source {
                    self.delete_rows_on_source().await?;
                }
                self.enter(Phase::Done).await
            }
            (
                Phase::Reversible
                | Phase::Done
                | Phase::Reverted
                | Phase::Aborting
                | Phase::Aborted,
                _,
            ) => {
                unreachable!("drive handles the final phases")
            }
        }
    }

    /// Moves the record from the phase this run believes it is in to `phase`, reloads it and
    /// tells the observer. Refused when another process has moved the phase on meanwhile.
    async fn enter(&mut self, phase: Phase) -> Result<(), Error> {
        let from = self.record.phase;
        point!("enter.{}", phase);
        let moved = record::set_phase(&self.directory, self.id(), from, phase)
            .await
            .at(Step::Record, Place::Directory)?;
        if !moved {
            self.reload().await?;
            return Err(self.moved_on(from));
        }
        self.entered().await
    }

    fn moved_on(&self, expected: Phase) -> Error {
        Error::State {
            move_id: self.id(),
            phase: self.record.phase,
            why: format!(
                "its record says {}, not {expected}: another process moved it on (or a freeze's \
                 lease ended and a router released the entity)",
                self.record.phase
            ),
        }
    }

    async fn reload(&mut self) -> Result<(), Error> {
        self.record = record::load(&self.directory, self.id())
            .await
            .at(Step::Record, Place::Directory)?
            .expect("a move record is never deleted");
        Ok(())
    }

    async fn entered(&mut self) -> Result<(), Error> {
        self.reload().await?;
        self.observer
            .phase(self.record.move_id, self.record.phase)
            .await;
        Ok(())
    }

    /// Connects again where a connection was lost (a server restarted, a session ended): the
    /// directory's new session takes the move's lock again (another process may have taken it
    /// meanwhile: `Busy`), and a target that could not be reached is tried again.
    async fn reconnect(&mut self) -> Result<(), Error> {
        let id = self.id();
        if self.directory.is_closed() {
            let directory = self.mover.connect_directory(Some(id)).await?;
            self.mover.lock_move(&directory, id).await?;
            self.directory = directory;
        }
        if self.source.client.is_closed() {
            self.source = Side::connect(self.source.endpoint.clone(), Some(id)).await?;
        }
        if !matches!(&self.target, Ok(t) if !t.client.is_closed()) {
            let shard = &self.record.target_shard;
            let endpoint =
                registry::endpoint(&self.directory, &self.mover.overrides, shard).await?;
            self.target = Ok(Side::connect(endpoint, Some(id)).await?);
        }
        Ok(())
    }

    /// New sessions on both shards, for a run whose statements there may still be running (a
    /// check cut off by the freeze's deadline runs on until its session ends): what undoes the
    /// freeze must not queue behind it. The old sessions are ended (`end_other_sessions`) by
    /// what comes next.
    async fn fresh_shard_sessions(&mut self) -> Result<(), Error> {
        let id = self.id();
        self.source = Side::connect(self.source.endpoint.clone(), Some(id)).await?;
        if let Ok(target) = &self.target {
            self.target = Ok(Side::connect(target.endpoint.clone(), Some(id)).await?);
        }
        Ok(())
    }
}
