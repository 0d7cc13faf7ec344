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

use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_protocol::{EntityKey, State};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::copy;
use crate::entry::{self, Placement};
use crate::error::{At, Error, Failure, Left, Place, Step};
use crate::failpoint::point;
use crate::fence::{self, Fence};
use crate::initial_copy;
use crate::integrity;
use crate::logical::{self, Trouble};
use crate::mover::Mover;
use crate::observer::Observer;
use crate::options::MoveOptions;
use crate::patience::Patience;
use crate::phase::Phase;
use crate::progress::Rates;
use crate::purge;
use crate::record::{self, Method, MoveRecord};
use crate::registry;
use crate::schema;
use crate::sequences;
use crate::side::Side;
use crate::tablesync::LostSlots;
use crate::tracking::{self, Changed, Tracker, Tracking};
use crate::triggers;
use crate::verify;

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

/// How long the source's cutover fence may wait for the shard's checked transactions in flight:
/// the directory's version lock, which every directory writer needs, is held meanwhile.
const CUTOVER_FENCE_WAIT: Duration = Duration::from_millis(300);

/// Copies of every table made in one run before a lost tablesync slot stops the move.
const COPY_ATTEMPTS: u32 = 3;

/// How the wait for the subscription's initial copy ended.
enum Synced {
    Ready,
    /// These tables' copies PostgreSQL can no longer finish (`tablesync`).
    Lost(Vec<String>),
}

/// The directory steps a move makes, each committed with the record's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirectoryStep {
    Freeze,
    /// Undoes a freeze the source's fence never joined: back to migrating, the copy kept.
    Thaw,
    Complete,
    Abort,
}

/// Fails with `FreezeExceeded` when `work` does not finish by `deadline`.
async fn within<T>(
    deadline: Instant,
    limit: Duration,
    step: Step,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .unwrap_or(Err(Error::FreezeExceeded { step, limit }))
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
    /// (`schema.rs`).
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

    /// A fence change on `side`, retried while the shard gives up waiting for its checked
    /// transactions in flight (up to `--fence-wait`): a fence that did not commit changes
    /// nothing, so it is worth another try rather than a failed move.
    async fn set_fence_patiently(&self, side: &Side, to: &Fence, step: Step) -> Result<(), Error> {
        point!(
            "fence.{:?}.{}",
            step,
            if std::ptr::eq(side, &self.source) {
                "source"
            } else {
                "target"
            }
        );
        let (client, key) = (&side.client, &self.key);
        fence::patiently(self.options.fence_patience, move || {
            fence::set(client, key, to)
        })
        .await
        .at(step, side.name())
    }

    /// Until the cutover, nothing but the move writes the entity on the target: an abort then
    /// deletes only what the move wrote there. (Logical apply and the mover's own writes pass the
    /// fence; reads go through, as the guide's dual read needs.)
    async fn fence_target_during_move(&self) -> Result<(), Error> {
        let target = self.target(Step::Begin)?;
        self.set_fence_patiently(target, &Fence::Frozen, Step::Begin)
            .await
    }

    /// Runs a directory step unless the entry is already past it, and records `phase` (and the
    /// step's version) in the same directory transaction, which first locks the move's row (as
    /// `release_expired_freeze` does) and checks its phase is still this run's.
    async fn directory_step(&mut self, step: DirectoryStep, phase: Phase) -> Result<(), Error> {
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

    /// `trouble` of the replication from `shard` (the publisher) to `subscriber`.
    fn replication_trouble(
        &self,
        step: Step,
        (shard, subscriber): (&str, &str),
        trouble: Trouble,
        what: &str,
    ) -> Error {
        match trouble {
            Trouble::Db(e) => Error::Db {
                step,
                place: Place::Shard(shard.to_owned()),
                source: e,
            },
            Trouble::Subscriber(e) => Error::Db {
                step,
                place: Place::Shard(subscriber.to_owned()),
                source: e,
            },
            Trouble::NotOurs(why) => Error::State {
                move_id: self.id(),
                phase: self.record.phase,
                why,
            },
            Trouble::Blocked(blockers) => Error::Blocked {
                step,
                shard: shard.to_owned(),
                what: what.to_owned(),
                waited: self.options.fence_patience,
                blockers,
            },
        }
    }

    /// Logical: publication and subscription, then the initial copy of every table: the
    /// subscription's own, or with a pace the mover's (`initial_copy`). A copy of the mover's
    /// found unfinished, or where the subscription is now to copy, is made again from the start,
    /// and so is one PostgreSQL can no longer finish (`tablesync`), up to [`COPY_ATTEMPTS`] times.
    async fn replicate(&mut self) -> Result<(), Error> {
        let mut attempt = 1;
        loop {
            let lost = match self.replicate_once().await? {
                Synced::Ready => return Ok(()),
                Synced::Lost(tables) => tables,
            };
            let target = self.target(Step::Sync)?.name().to_owned();
            if attempt == COPY_ATTEMPTS {
                return Err(Error::TablesyncLost {
                    step: Step::Sync,
                    table: lost.join(", "),
                    from: self.source.name().to_owned(),
                    to: target,
                    attempts: attempt,
                });
            }
            self.observer.note(
                self.id(),
                &format!(
                    "the initial copy of {} on shard {target} lost its tablesync slot on shard {} \
                     (the target stopped as PostgreSQL finished the table's copy); copying every \
                     table again",
                    lost.join(", "),
                    self.source.name()
                ),
            );
            self.copy_again().await?;
            attempt += 1;
        }
    }

    /// Back to before the initial copy: the replication dropped (the next copy begins by deleting
    /// the rows this one made: `replicate_once`).
    async fn copy_again(&mut self) -> Result<(), Error> {
        self.drop_replication(Step::Sync).await?;
        for p in self.record.tables.values_mut() {
            (p.copied, p.rows_per_second, p.eta_seconds) = (0, None, None);
        }
        Ok(())
    }

    async fn replicate_once(&mut self) -> Result<Synced, Error> {
        let name = self.record.replication_name.clone();
        let paced = self.options.throttle().paces() && self.record.reverses.is_none();
        let mut signature = logical::signature(&self.record);
        let copied_by_mover = initial_copy::signature(&signature);
        let target = self.target(Step::Replicate)?;
        let found = logical::subscription_comment(&target.client, &name)
            .await
            .at(Step::Replicate, target.name())?;
        let published = logical::publication_comment(&self.source.client, &name)
            .await
            .at(Step::Replicate, self.source.name())?;
        // A paced copy is made again from the start; and replication made for the other kind of
        // copy (the move ran with a pace, and is resumed without, or the other way) is made again.
        let other = if paced { &signature } else { &copied_by_mover };
        let mut kept = found.is_some();
        if found.is_some() && paced || [&found, &published].contains(&&Some(other.clone())) {
            point!("replicate.drop_other");
            self.drop_replication(Step::Replicate).await?;
            kept = false;
        }
        if paced {
            signature = copied_by_mover;
        } else if !kept && self.record.reverses.is_none() {
            // Whatever made rows of the entity on the target before (a copy of the mover's, a
            // subscription dropped mid-copy, a run killed between the two), the subscription's
            // copy starts from a target without them: it would stop on their keys. (The paced
            // copy deletes them in its own transaction; a revert's target holds the way back's.)
            self.delete_rows_on_target(Step::Replicate).await?;
        }
        let target = self.target(Step::Replicate)?;
        point!("replicate.publication");
        let publication = logical::ensure_publication(
            &self.source.client,
            &name,
            &self.tables,
            &self.key.entity_id,
            &signature,
        )
        .await;
        publication.map_err(|t| {
            let shards = (self.source.name(), target.name());
            self.replication_trouble(Step::Replicate, shards, t, "the publication")
        })?;
        point!("replicate.subscription");
        let subscription = logical::ensure_subscription(
            &self.source.client,
            &target.client,
            &name,
            &self.source.endpoint.replication_conninfo,
            &signature,
            self.options.fence_patience,
            if paced {
                logical::Begin::Off
            } else {
                logical::Begin::CopyThenStream
            },
        )
        .await;
        subscription.map_err(|t| {
            let what = format!("creating replication slot {name}");
            let shards = (self.source.name(), target.name());
            self.replication_trouble(Step::Replicate, shards, t, &what)
        })?;
        if paced {
            return self.copy_paced().await.map(|()| Synced::Ready);
        }
        self.observer.step(self.id(), Step::Sync).await;
        let started = Instant::now();
        let mut saved = Instant::now();
        let mut lost = LostSlots::default();
        for poll in 0u32.. {
            let target = self.target(Step::Sync)?;
            let state = logical::sync_state(&target.client, &name)
                .await
                .at(Step::Sync, target.name())?;
            // Every half second, and at once when the subscription stopped: a lost slot stops
            // it (`disable_on_error`), and the copy is made again instead.
            if poll % 10 == 9 || !state.enabled {
                let target = self.target(Step::Sync)?;
                let lost = lost
                    .look(
                        (&self.source.client, self.source.name()),
                        (&target.client, target.name()),
                        &name,
                        Step::Sync,
                    )
                    .await?;
                if !lost.is_empty() {
                    return Ok(Synced::Lost(lost));
                }
            }
            if !lost.suspects() {
                self.check_replication(&state, Step::Sync).await?;
            }
            let id = self.id();
            for (table, ready, copied) in &state.tables {
                if let Some(p) = self.record.tables.get_mut(table) {
                    p.copied = if *ready { p.rows } else { *copied };
                    (p.rows_per_second, p.eta_seconds) =
                        self.rates.update(table, (p.copied, p.rows), Instant::now());
                    self.observer.rows(id, table, p.copied, p.rows);
                }
            }
            if state.all_ready() || saved.elapsed() > Duration::from_secs(1) {
                record::set_tables(&self.directory, self.id(), &self.record.tables)
                    .await
                    .at(Step::Record, Place::Directory)?;
                saved = Instant::now();
            }
            if state.all_ready() {
                // The copied rows get statistics before the freeze, so that the checks under it
                // (and the application's queries after the cutover) are planned for them, not for
                // the empty tables the copy began with.
                let target = self.target(Step::Sync)?;
                return logical::analyze(&target.client, &self.tables)
                    .await
                    .at(Step::Sync, target.name())
                    .map(|()| Synced::Ready);
            }
            if started.elapsed() > self.options.sync_timeout {
                // Tablesync slots wait for the source's transactions in progress, as the main
                // slot did: name them.
                let blockers = logical::transactions_in_progress(&self.source.client)
                    .await
                    .at(Step::Sync, self.source.name())?;
                let waiting: Vec<&str> = state
                    .tables
                    .iter()
                    .filter(|(_, ready, _)| !ready)
                    .map(|(table, _, _)| table.as_str())
                    .collect();
                return Err(Error::Timeout {
                    step: Step::Sync,
                    what: format!(
                        "the initial copy of {} on shard {} (its server log says why; \
                         transactions in progress on shard {}: {blockers})",
                        waiting.join(", "),
                        self.target(Step::Sync)?.name(),
                        self.source.name()
                    ),
                    after: self.options.sync_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!("the loop returns")
    }

    /// The mover's initial copy, paced: from a snapshot that matches the slot's position; then
    /// the subscription is turned on.
    async fn copy_paced(&mut self) -> Result<(), Error> {
        let (id, name) = (self.id(), self.record.replication_name.clone());
        self.target(Step::Sync)?;
        let Ok(target) = &self.target else {
            unreachable!("checked just above")
        };
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Sync, Place::Directory)?;
        let lock = self.source.another(id).await?;
        let (mut read, mut write) = (self.source.another(id).await?, target.another(id).await?);
        let snapshot = initial_copy::snapshot_at_slot(
            &self.source,
            (&lock, &mut read),
            &self.key,
            &name,
            self.options.fence_patience,
        )
        .await?;
        drop(lock);
        for p in self.record.tables.values_mut() {
            (p.copied, p.rows_per_second, p.eta_seconds) = (0, None, None);
        }
        let mut pace = initial_copy::Paced {
            move_id: id,
            throttle: self.options.throttle(),
            target: (&target.client, target.name()),
            source: (&self.source.client, self.source.name()),
            slot: (&name, self.options.max_slot_lag),
            directory: &self.directory,
            tables: &mut self.record.tables,
            rates: &mut self.rates,
            observer: &*self.observer,
            saved: Instant::now(),
        };
        copy::copy_rows(
            (&snapshot, self.source.name()),
            (&mut write, target.name()),
            (&self.tables, &self.key, version),
            Step::Sync,
            &mut pace,
        )
        .await?;
        snapshot.commit().await.at(Step::Sync, self.source.name())?;
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)?;
        point!("paced.enable_subscription");
        logical::enable_subscription(&target.client, &name)
            .await
            .at(Step::Sync, target.name())?;
        logical::analyze(&target.client, &self.tables)
            .await
            .at(Step::Sync, target.name())
    }

    /// The subscription is on (a subscription that stopped after an error is turned back on
    /// once per run, with a note), and the slot keeps no more WAL than `--max-slot-lag`.
    async fn check_replication(
        &mut self,
        state: &logical::SyncState,
        step: Step,
    ) -> Result<(), Error> {
        let name = self.record.replication_name.clone();
        logical::check_slot(
            (&self.source.client, self.source.name()),
            (self.id(), &name),
            self.options.max_slot_lag,
            step,
        )
        .await?;
        if state.exists && state.enabled {
            return Ok(());
        }
        // A subscription stopped by DDL on one shard only: named, rather than turned on again.
        self.check_schema(step).await?;
        let target = self.target(step)?;
        if state.exists && !self.reenabled {
            self.observer.note(
                self.id(),
                &format!(
                    "subscription {name} on shard {} stopped after {} error(s) (its server log \
                     there says why); turning it on again",
                    target.name(),
                    state.errors
                ),
            );
            point!("replicate.reenable");
            logical::enable_subscription(&target.client, &name)
                .await
                .at(step, target.name())?;
            self.reenabled = true;
            return Ok(());
        }
        Err(Error::SubscriptionFailed {
            step,
            name,
            shard: target.name().to_owned(),
            errors: state.errors,
        })
    }

    /// Waits until the slot confirms `lsn`, or `deadline`; returns the confirmed position.
    async fn wait_confirmed(
        &mut self,
        lsn: &str,
        deadline: Instant,
        on_timeout: impl Fn() -> Error,
    ) -> Result<String, Error> {
        let name = self.record.replication_name.clone();
        for poll in 0u32.. {
            let (passed, confirmed, behind) = logical::confirmed(&self.source.client, &name, lsn)
                .await
                .at(Step::CatchUp, self.source.name())?;
            if passed {
                return Ok(confirmed);
            }
            self.observer.lag(self.id(), behind);
            if Instant::now() >= deadline {
                return Err(on_timeout());
            }
            if poll % 50 == 49 {
                let target = self.target(Step::CatchUp)?;
                let state = logical::sync_state(&target.client, &name)
                    .await
                    .at(Step::CatchUp, target.name())?;
                self.check_replication(&state, Step::CatchUp).await?;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        unreachable!("the loop returns")
    }

    /// Before freezing: probes until the target catches up with the source within a quarter of
    /// `max_freeze`, so the catch-up under the freeze is expected to fit in it; returns how long
    /// the last catch-up took.
    async fn wait_for_small_lag(&mut self) -> Result<Duration, Error> {
        let started = Instant::now();
        let small = max_freeze(&self.record) / 4;
        let limit = self.options.sync_timeout;
        loop {
            let lsn = logical::catchup_position(&self.source.client)
                .await
                .at(Step::CatchUp, self.source.name())?;
            let probe = Instant::now();
            self.wait_confirmed(&lsn, started + limit, || Error::Timeout {
                step: Step::CatchUp,
                what: "the target to catch up with the source".into(),
                after: limit,
            })
            .await?;
            let took = probe.elapsed();
            if took <= small {
                return Ok(took);
            }
            let lag = logical::lag_bytes(&self.source.client, &self.record.replication_name)
                .await
                .at(Step::CatchUp, self.source.name())?;
            self.observer.note(
                self.id(),
                &format!(
                    "catch-up took {took:?} (lag {lag} bytes); waiting for it to take under {small:?}"
                ),
            );
        }
    }

    /// While the entity is writable: change tracking starts on both shards, then every row is
    /// compared (and what the moved rows reference looked for on the target), so that the freeze
    /// checks only the rows that differed or changed since. A shard that cannot be tracked
    /// leaves the whole comparison to the freeze, with a note.
    async fn check_online(&mut self) -> Result<(), Error> {
        let (id, patience) = (self.id(), self.options.fence_patience);
        let target = self.target(Step::Track)?;
        point!("track.start");
        let source_stream =
            Tracker::start(&self.source, id, &self.tables, &self.key, patience).await?;
        let target_stream = Tracker::start(target, id, &self.tables, &self.key, patience).await?;
        let (source_stream, target_stream) = match (source_stream, target_stream) {
            (Ok(s), Ok(t)) => (s, t),
            (Err(why), _) | (_, Err(why)) => {
                self.observer
                    .note(id, &format!("the freeze will compare every row: {why}"));
                self.untracked = Some(why);
                return Ok(());
            }
        };
        let started = Instant::now();
        let (counts, changed) = verify::online(
            (&self.source.client, self.source.name()),
            (&target.client, target.name()),
            &self.tables,
            &self.key,
        )
        .await?;
        integrity::check_references_present(
            &target.client,
            target.name(),
            &self.tables,
            &self.key,
            None,
        )
        .await?;
        self.observer.note(
            id,
            &format!(
                "compared every row online in {:?}; {} key(s) to compare again under the freeze",
                started.elapsed(),
                changed.len()
            ),
        );
        for (table, rows) in counts {
            if let Some(p) = self.record.tables.get_mut(&table) {
                p.verified = Some(rows);
            }
        }
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)?;
        self.tracking = Some(Tracking {
            source: source_stream,
            target: target_stream,
            changed,
        });
        Ok(())
    }

    /// Before freezing with change tracking: catches up, then compares the rows changed since the
    /// online check while the entity is still writable (those equal now need no comparison under
    /// the freeze; one that changes again comes back through the streams). The freeze is
    /// estimated as that catch-up and that comparison; while the estimate exceeds half of
    /// `max_freeze` it catches up and compares again instead of freezing, up to `sync_timeout`.
    async fn estimate_freeze(&mut self) -> Result<(), Error> {
        let (started, budget) = (Instant::now(), max_freeze(&self.record) / 2);
        loop {
            self.observer.step(self.id(), Step::CatchUp).await;
            let catch_up = self.wait_for_small_lag().await?;
            let compared = Instant::now();
            let mut tracking = self.tracking.take().expect("tracking the entity's changes");
            let left = async {
                tracking.drain(&self.tables).await?;
                let target = self.target(Step::Verify)?;
                verify::still_differing(
                    (&self.source.client, self.source.name()),
                    (&target.client, target.name()),
                    &self.tables,
                    &self.key,
                    &tracking.changed,
                )
                .await
            }
            .await;
            let (before, compare) = (tracking.changed.len(), compared.elapsed());
            let left = left.map(|left| tracking.changed = left);
            self.tracking = Some(tracking);
            left?;
            let estimate = catch_up + compare;
            let note = format!(
                "estimated freeze {estimate:?}: a catch-up of {catch_up:?} and {before} changed \
                 key(s) compared in {compare:?}"
            );
            if estimate <= budget {
                self.observer.note(self.id(), &note);
                return Ok(());
            }
            if started.elapsed() > self.options.sync_timeout {
                return Err(Error::Timeout {
                    step: Step::CatchUp,
                    what: format!("an estimated freeze within half of --max-freeze ({note})"),
                    after: self.options.sync_timeout,
                });
            }
            self.observer.note(
                self.id(),
                &format!("{note}; over half of --max-freeze, catching up again"),
            );
        }
    }

    /// A freeze that ran past `max_freeze`, undone with the copy kept ([`Run::thaw`]). The next
    /// freeze follows a new online check: a stream read cut off by the deadline may have
    /// consumed changes the mover never saw.
    async fn unfreeze(&mut self, exceeded: Error) -> Result<(), Error> {
        self.freezes_undone += 1;
        self.thaw().await?;
        self.observer.note(
            self.id(),
            &format!(
                "{exceeded}; the freeze was undone, the copy kept: freezing again (freeze {} of \
                 {})",
                self.freezes_undone + 1,
                self.options.freeze_attempts
            ),
        );
        Ok(())
    }

    /// Undoes a freeze with the copy kept, the directory first: the entry back to migrating (the
    /// record back to catching up, or to migrating for the copy method, whose next freeze copies
    /// again), then (on new sessions: a check cut off by the deadline may still run on the old
    /// ones, which are ended) the target fenced as during the move and the source's fence as
    /// before it.
    async fn thaw(&mut self) -> Result<(), Error> {
        self.tracking = None;
        self.directory_step(DirectoryStep::Thaw, thawed(self.record.method))
            .await?;
        (self.deadline, self.fenced_here, self.verified_here) = (None, false, false);
        self.fresh_shard_sessions().await?;
        self.source.end_other_sessions(self.id()).await?;
        self.target(Step::Freeze)?
            .end_other_sessions(self.id())
            .await?;
        self.fence_target_during_move().await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Freeze)
            .await
    }

    /// Freezes the entry (its version `F` is what the source's lease admits clients above once
    /// it ends), then fences the source frozen, which waits for its checked writers in flight.
    /// From here an error aborts the move; a source fence that cannot commit undoes the freeze
    /// instead, keeping the copy.
    async fn freeze(&mut self) -> Result<(), Error> {
        self.check_schema(Step::Freeze).await?;
        if self.record.reversible {
            point!("way_back.create");
            self.ensure_way_back().await?;
        }
        self.wait_for_open_checks().await?;
        self.deadline = Some(Instant::now() + max_freeze(&self.record));
        self.directory_step(DirectoryStep::Freeze, Phase::Frozen)
            .await?;
        self.fence_source_frozen(self.lease()).await
    }

    /// Before freezing anything: the source's fence will wait for every checked transaction in
    /// flight there, so one left open (idle in a transaction) would hold the freeze as long as it
    /// stays. Waits up to `--fence-wait` for none to have been open over a second; past that,
    /// stops (resumable, nothing frozen) naming them.
    async fn wait_for_open_checks(&self) -> Result<(), Error> {
        let (started, patience) = (Instant::now(), self.options.fence_patience);
        loop {
            let lingering = fence::lingering_checks(&self.source.client)
                .await
                .at(Step::Freeze, self.source.name())?;
            match lingering {
                None => return Ok(()),
                Some(blockers) if started.elapsed() >= patience => {
                    return Err(Error::Blocked {
                        step: Step::Freeze,
                        shard: self.source.name().to_owned(),
                        what: "freezing the entity (its fence waits for checked transactions in \
                               flight)"
                            .into(),
                        waited: patience,
                        blockers,
                    })
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The source's fence, frozen for the freeze's lease. When it cannot commit in time (the shard
    /// keeps giving up behind open transactions), the directory's freeze is undone and the move
    /// goes back to catching up with its copy: nothing was frozen on the source.
    async fn fence_source_frozen(&mut self, lease: Duration) -> Result<(), Error> {
        let deadline = self.deadline.expect("set with the freeze");
        let freeze_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        let patience = self
            .options
            .fence_patience
            .min(deadline.saturating_duration_since(Instant::now()));
        let (client, key) = (&self.source.client, &self.key);
        point!("fence.freeze_leased.source");
        let fenced = fence::patiently(patience, move || {
            fence::freeze_leased(client, key, lease, freeze_version)
        })
        .await;
        match fenced {
            Ok(()) => {
                self.fenced_here = true;
                Ok(())
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                self.directory_step(DirectoryStep::Thaw, thawed(self.record.method))
                    .await?;
                self.deadline = None;
                self.observer.note(
                    self.id(),
                    "the source's fence could not commit: the freeze was undone, the copy kept; \
                     `resume` tries again",
                );
                Err(Error::Db {
                    step: Step::Freeze,
                    place: Place::Shard(self.source.name().to_owned()),
                    source: e,
                })
            }
            Err(e) => Err(Error::Db {
                step: Step::Freeze,
                place: Place::Shard(self.source.name().to_owned()),
                source: e,
            }),
        }
    }

    /// A freeze this run did not start (resumed, or verified by an earlier run) keeps the budget
    /// and the lease it began with: however often it is stopped and resumed, the entity is
    /// refused no longer than one lease. The source is fenced again, for what is left of the
    /// lease, before anything relies on it; a freeze with no budget left is over.
    async fn hold_freeze(&mut self) -> Result<(), Error> {
        let id = self.id();
        let at = |e| Error::Db {
            step: Step::Freeze,
            place: Place::Directory,
            source: e,
        };
        let tx = self.directory.transaction().await.map_err(at)?;
        let (locked, _) = record::lock(&tx, id).await.map_err(at)?;
        if locked != self.record.phase {
            drop(tx);
            let expected = self.record.phase;
            self.reload().await?;
            return Err(self.moved_on(expected));
        }
        let left = record::lease_left(&tx, id).await.map_err(at)?;
        tx.commit().await.map_err(at)?;
        let budget = left.saturating_sub(self.options.lease_grace);
        if budget.is_zero() {
            return Err(Error::FreezeExceeded {
                step: Step::Freeze,
                limit: max_freeze(&self.record),
            });
        }
        self.deadline = Some(Instant::now() + budget);
        self.fence_source_frozen(left).await
    }

    /// Under the freeze: catch up (logical) or copy, verify, check foreign keys, advance
    /// sequences, fence the target owned.
    async fn catch_up_and_verify(&mut self) -> Result<(), Error> {
        if !self.fenced_here {
            self.hold_freeze().await?;
        }
        let deadline = self.deadline.expect("a frozen move has a deadline");
        let limit = max_freeze(&self.record);
        match self.record.method {
            Method::Logical => {
                // Taken after the fence committed: every write of the entity precedes it.
                let lsn = logical::catchup_position(&self.source.client)
                    .await
                    .at(Step::CatchUp, self.source.name())?;
                record::set_positions(&self.directory, self.id(), Some(&lsn), None)
                    .await
                    .at(Step::Record, Place::Directory)?;
                let confirmed = self
                    .wait_confirmed(&lsn, deadline, || Error::FreezeExceeded {
                        step: Step::CatchUp,
                        limit,
                    })
                    .await?;
                record::set_positions(&self.directory, self.id(), None, Some(&confirmed))
                    .await
                    .at(Step::Record, Place::Directory)?;
            }
            Method::Copy => within(deadline, limit, Step::Copy, self.copy()).await?,
        }
        let mut tracking = self.tracking.take();
        let checked = self.check_rows(tracking.as_mut(), deadline, limit).await;
        self.tracking = tracking;
        checked?;
        let target = self.target(Step::Verify)?;
        within(
            deadline,
            limit,
            Step::Sequences,
            sequences::advance(
                (&self.source.client, self.source.name()),
                (&target.client, target.name()),
                &self.tables,
            ),
        )
        .await?;
        let min_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        within(
            deadline,
            limit,
            Step::FenceTarget,
            self.set_fence_patiently(target, &Fence::Owned { min_version }, Step::FenceTarget),
        )
        .await?;
        self.verified_here = true;
        Ok(())
    }

    /// Under the freeze: the rows changed since the online check (every row without one) compared
    /// on both sides, and what they reference looked for on the target.
    async fn check_rows(
        &mut self,
        tracking: Option<&mut Tracking>,
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), Error> {
        let changed = match tracking {
            Some(tracking) => {
                within(deadline, limit, Step::Track, tracking.drain(&self.tables)).await?;
                let target = self.target(Step::Verify)?;
                let compared = verify::recheck(
                    (&self.source.client, self.source.name()),
                    (&target.client, target.name()),
                    &self.tables,
                    &self.key,
                    &tracking.changed,
                );
                within(deadline, limit, Step::Verify, compared).await?;
                Some(&tracking.changed)
            }
            None => {
                let target = self.target(Step::Verify)?;
                let counts = within(
                    deadline,
                    limit,
                    Step::Verify,
                    verify::verify(
                        (&self.source.client, self.source.name()),
                        (&target.client, target.name()),
                        &self.tables,
                        &self.key,
                    ),
                )
                .await?;
                for (table, rows) in counts {
                    if let Some(p) = self.record.tables.get_mut(&table) {
                        p.verified = Some(rows);
                        p.copied = rows;
                    }
                }
                record::set_tables(&self.directory, self.id(), &self.record.tables)
                    .await
                    .at(Step::Record, Place::Directory)?;
                None
            }
        };
        self.check_references(changed, deadline, limit).await
    }

    /// No row may join the entity to another one; and logical apply checks no foreign key, nor
    /// does a copy made as replica (`triggers`), so after them what the moved rows (`changed`:
    /// those changed since the online check) reference must be on the target.
    async fn check_references(
        &self,
        changed: Option<&Changed>,
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), Error> {
        let target = self.target(Step::Verify)?;
        within(deadline, limit, Step::Verify, async {
            integrity::check_crossings(
                &self.source.client,
                self.source.name(),
                &self.tables,
                &self.key,
                Step::Verify,
            )
            .await?;
            if self.record.method != Method::Logical
                && !triggers::copy_as_replica(
                    &target.client,
                    target.name(),
                    &self.tables,
                    Step::Verify,
                )
                .await?
            {
                return Ok(());
            }
            integrity::check_references_present(
                &target.client,
                target.name(),
                &self.tables,
                &self.key,
                changed,
            )
            .await
        })
        .await
    }

    /// Method copy: the entity's rows, over connections of their own (a copy cut off by the
    /// deadline leaves them mid-stream; an abort ends them). The source is frozen, so its rows
    /// hold still; one snapshot makes that explicit.
    async fn copy(&self) -> Result<(), Error> {
        let target = self.target(Step::Copy)?;
        let mut read = self.source.another(self.id()).await?;
        let mut write = target.another(self.id()).await?;
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Copy, Place::Directory)?;
        let (id, observer, record) = (self.id(), &self.observer, &self.record);
        let snapshot = copy::snapshot(&mut read, self.source.name(), Step::Copy).await?;
        copy::copy_rows(
            (&snapshot, self.source.name()),
            (&mut write, target.name()),
            (&self.tables, &self.key, version),
            Step::Copy,
            &mut copy::Unpaced(|table: &str, rows: u64| {
                let total = record.tables.get(table).map_or(rows as i64, |p| p.rows);
                observer.rows(id, table, rows as i64, total);
            }),
        )
        .await?;
        snapshot.commit().await.at(Step::Copy, self.source.name())
    }

    /// `complete_move`, the point of no return, unless the freeze has run out (this run's
    /// budget, or the lease the directory checks in the same transaction), or the source is no
    /// longer frozen: then nothing written on it since its catch-up would be carried.
    async fn cutover(&mut self) -> Result<(), Error> {
        if !self.verified_here {
            let checked = self.catch_up_and_verify().await;
            self.unless_ddl(checked).await?;
        }
        let deadline = self.deadline.expect("a frozen move has a deadline");
        if Instant::now() >= deadline {
            return Err(Error::FreezeExceeded {
                step: Step::Cutover,
                limit: max_freeze(&self.record),
            });
        }
        // The last look for DDL, inside the freeze's budget.
        let limit = max_freeze(&self.record);
        let found = within(
            deadline,
            limit,
            Step::Cutover,
            self.check_schema(Step::Cutover),
        )
        .await;
        self.unless_ddl(found).await?;
        if self.record.reversible {
            let target = self.target(Step::WayBack)?;
            let name = logical::way_back_name(self.id());
            let skipped = async {
                point!("way_back.skip");
                logical::skip_to_now(&target.client, &name)
                    .await
                    .at(Step::WayBack, target.name())
            };
            let limit = max_freeze(&self.record);
            within(deadline, limit, Step::WayBack, skipped).await?;
        }
        let fence = fence::read(&self.source.client, &self.key)
            .await
            .at(Step::Cutover, self.source.name())?;
        if !matches!(fence, Fence::Frozen | Fence::Cutover) {
            return Err(Error::State {
                move_id: self.id(),
                phase: self.record.phase,
                why: format!(
                    "the source's fence is {fence}, not frozen: someone changed it by hand, and \
                     writes since its catch-up would be lost; the move is undone"
                ),
            });
        }
        // The source's cutover fence waits for its checked transactions in flight while the
        // directory's version lock is held: briefly, and tried again within the freeze.
        loop {
            let done = self
                .directory_step(DirectoryStep::Complete, Phase::Cutover)
                .await;
            match done {
                Err(Error::Db { source, .. })
                    if source.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                        && Instant::now() + CUTOVER_FENCE_WAIT < deadline =>
                {
                    tokio::time::sleep(CUTOVER_FENCE_WAIT / 5).await
                }
                done => break done?,
            }
        }
        self.deadline = None;
        self.tracking = None;
        Ok(())
    }

    /// Drops the subscription (on the target) and the slot and publication (on the source), and
    /// change tracking's on both.
    async fn drop_replication(&self, step: Step) -> Result<(), Error> {
        if self.record.method != Method::Logical {
            return Ok(());
        }
        let name = &self.record.replication_name;
        let target = self.target(step)?;
        point!("replication.drop.{:?}", step);
        logical::drop_subscription(&target.client, name)
            .await
            .at(step, target.name())?;
        logical::drop_publication(&self.source.client, name)
            .await
            .at(step, self.source.name())?;
        self.drop_tracking(step).await
    }

    async fn drop_tracking(&self, step: Step) -> Result<(), Error> {
        let target = self.target(step)?;
        tracking::drop(&target.client, self.id())
            .await
            .at(step, target.name())?;
        tracking::drop(&self.source.client, self.id())
            .await
            .at(step, self.source.name())
    }

    /// `--reversible`: the way back, made before the freeze (its slot waits for the target's
    /// transactions in progress, which must not be under the freeze) and left off until the
    /// forward replication is gone.
    async fn ensure_way_back(&self) -> Result<(), Error> {
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
    async fn open_way_back(&mut self) -> Result<(), Error> {
        let name = logical::way_back_name(self.id());
        point!("way_back.open");
        logical::enable_subscription(&self.source.client, &name)
            .await
            .at(Step::WayBack, self.source.name())?;
        self.enter(Phase::Reversible).await
    }

    /// Drops the way back, when the move is reversible: its subscription on the source, its
    /// slot and publication on the target.
    async fn drop_way_back(&self, step: Step) -> Result<(), Error> {
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

    /// Deletes the entity's rows from the target. It held none when the move began (preflight),
    /// and its fence let nothing but the move write them since: all there are the move's.
    async fn delete_rows_on_target(&mut self, step: Step) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(step, Place::Directory)?;
        self.target(step)?;
        let Ok(target) = self.target.as_mut() else {
            unreachable!("checked just above")
        };
        // What the copy or logical apply wrote fired none of the target's triggers; nor does
        // taking it away.
        let replica =
            triggers::delete_as_replica(&target.client, &target.endpoint.name, &self.tables, step)
                .await;
        point!("purge.target.{:?}", step);
        purge::delete_rows(
            (&mut target.client, &target.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            step,
            replica,
            |_, _| {},
        )
        .await
    }

    async fn delete_rows_on_source(&mut self) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::DeleteSource, Place::Directory)?;
        let (id, observer) = (self.id(), self.observer.clone());
        let replica = triggers::delete_as_replica(
            &self.source.client,
            &self.source.endpoint.name,
            &self.tables,
            Step::DeleteSource,
        )
        .await;
        let (tables, rates) = (&mut self.record.tables, &mut self.rates);
        point!("purge.source");
        purge::delete_rows(
            (&mut self.source.client, &self.source.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            Step::DeleteSource,
            replica,
            |table, deleted| {
                if let Some(p) = tables.get_mut(table) {
                    p.deleted = deleted as i64;
                    (p.rows_per_second, p.eta_seconds) =
                        rates.update(table, (p.deleted, p.rows), Instant::now());
                    observer.rows(id, table, p.deleted, p.rows);
                }
            },
        )
        .await?;
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// Back to the start, the directory first: in one directory transaction the move becomes
    /// `aborting` and its entry active on its source again, so the entity is released before
    /// anything that can wait on a shard. Then the source's fence as it was (a frozen fence left
    /// behind ends with its lease), and the target cleaned: replication dropped, the move's rows
    /// deleted, its fence as it was. A connection lost on the way (a server restarted, a
    /// session ended) is made again and the abort goes on, for up to `--fence-wait`.
    pub(crate) async fn abort(&mut self) -> Result<(), Error> {
        let mut patience = Patience::new(self.options.fence_patience);
        loop {
            let lost = match self.abort_once().await {
                Err(e) if e.lost_connection() => e,
                done => return done,
            };
            loop {
                if !patience.pause().await {
                    return Err(lost);
                }
                match self.reconnect().await {
                    Ok(()) => break,
                    Err(e) if e.lost_connection() => {}
                    Err(e) => return Err(e),
                }
            }
            self.observer.note(
                self.id(),
                &format!("the abort lost a connection ({lost}); connected again, going on"),
            );
        }
    }

    async fn abort_once(&mut self) -> Result<(), Error> {
        let id = self.id();
        if !self.released {
            match self
                .directory_step(DirectoryStep::Abort, Phase::Aborting)
                .await
            {
                // Released meanwhile by its lease (`release_expired_freeze`): the same abort.
                Err(Error::State { .. }) if self.record.phase == Phase::Aborting => {
                    self.directory_step(DirectoryStep::Abort, Phase::Aborting)
                        .await?
                }
                released => released?,
            }
            (self.released, self.deadline) = (true, None);
        }
        if self.stale_sessions {
            self.fresh_shard_sessions().await?;
            self.stale_sessions = false;
        }
        point!("abort.end_sessions.source");
        self.source.end_other_sessions(id).await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Abort)
            .await?;
        let target = self.target(Step::Abort)?;
        point!("abort.end_sessions.target");
        target.end_other_sessions(id).await?;
        if self.record.reverses.is_some() {
            // A revert's replication and the rows on its target are the reversible move's way
            // back: they stay, and the target's fence goes back to `moved`.
            self.drop_tracking(Step::Abort).await?;
            let before = self.record.target_fence.clone();
            self.set_fence_patiently(target, &before, Step::Abort)
                .await?;
            return self.enter(Phase::Aborted).await;
        }
        self.drop_replication(Step::Abort).await?;
        self.drop_way_back(Step::Abort).await?;
        self.delete_rows_on_target(Step::Abort).await?;
        let target = self.target(Step::Abort)?;
        let before = self.record.target_fence.clone();
        self.set_fence_patiently(target, &before, Step::Abort)
            .await?;
        self.enter(Phase::Aborted).await
    }

    /// DDL on the entity's tables since this run began (`schema.rs`): fails naming it.
    async fn check_schema(&mut self, step: Step) -> Result<(), Error> {
        self.target(step)?;
        let Ok(target) = &self.target else {
            unreachable!("checked just above")
        };
        let source = (&self.source.client, self.source.name());
        let target = (&target.client, target.name());
        self.schema.check(source, target, &self.key, step).await
    }

    /// Under the freeze: DDL found (`result` is [`Error::SchemaChanged`]), or an error DDL
    /// explains (a column gone from a copy's statement, rows that differ in a retyped column),
    /// undoes the freeze with the copy kept and stops the move resumable, naming the change,
    /// where any other error aborts it. A freeze past its budget is left to that path: a check
    /// it cut off may still hold the sessions.
    async fn unless_ddl(&mut self, result: Result<(), Error>) -> Result<(), Error> {
        let ddl = match result {
            Ok(()) => return Ok(()),
            Err(e @ Error::FreezeExceeded { .. }) => return Err(e),
            Err(ddl @ Error::SchemaChanged { .. }) => ddl,
            Err(e) => match self.check_schema(Step::Verify).await {
                Err(ddl @ Error::SchemaChanged { .. }) => ddl,
                _ => return Err(e),
            },
        };
        self.thaw().await?;
        Err(ddl)
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
