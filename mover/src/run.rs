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
use crate::fence::{self, Fence};
use crate::initial_copy;
use crate::integrity;
use crate::logical::{self, Trouble};
use crate::observer::Observer;
use crate::options::MoveOptions;
use crate::phase::Phase;
use crate::progress::Rates;
use crate::purge;
use crate::record::{self, Method, MoveRecord};
use crate::sequences;
use crate::side::Side;
use crate::tablesync::LostSlots;
use crate::tracking::{self, Changed, Tracker, Tracking};
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

/// Copies of every table made in one run before a lost tablesync slot stops the move.
const COPY_ATTEMPTS: u32 = 3;

/// How the wait for the subscription's initial copy ended.
enum Synced {
    Ready,
    /// These tables' copies PostgreSQL can no longer finish (`tablesync`).
    Lost(Vec<String>),
}

/// The directory steps a move makes, each committed with the record's phase.
#[derive(Clone, Copy, PartialEq, Eq)]
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
    options: &'m MoveOptions,
    observer: Arc<dyn Observer>,
    directory: Client,
    pub(crate) record: MoveRecord,
    key: EntityKey,
    source: Side,
    /// The target, or why it could not be reached: an abort still releases the entity without it.
    target: Result<Side, String>,
    tables: Vec<EntityTable>,
    /// When the freeze must be over; set when this run froze the entity or resumed it frozen.
    deadline: Option<Instant>,
    /// Whether this run froze the source itself (a resumed freeze fences it again first).
    fenced_here: bool,
    /// Whether this run caught up and verified under the freeze (a move resumed at `verified`
    /// is verified again: nothing says its source stayed frozen while no mover ran).
    verified_here: bool,
    /// Whether this run turned the subscription back on after it stopped on an error.
    reenabled: bool,
    /// Whether this run's abort has released the entity (source fence and directory restored).
    released: bool,
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
        options: &'m MoveOptions,
        observer: Arc<dyn Observer>,
        directory: Client,
        record: MoveRecord,
        source: Side,
        target: Result<Side, String>,
        tables: Vec<EntityTable>,
    ) -> Run<'m> {
        let key = record.entity();
        // A resumed frozen move gets a fresh freeze budget: the time it already spent frozen
        // (also while no mover ran) still counts in max_freeze_seen.
        let deadline = matches!(record.phase, Phase::Frozen | Phase::Verified)
            .then(|| Instant::now() + max_freeze(&record));
        Run {
            options,
            observer,
            directory,
            record,
            key,
            source,
            target,
            tables,
            deadline,
            fenced_here: false,
            verified_here: false,
            reenabled: false,
            released: false,
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

    pub(crate) async fn drive(mut self) -> Result<MoveRecord, Failure> {
        loop {
            let result = match self.record.phase {
                Phase::Done | Phase::Reverted | Phase::Aborted | Phase::Reversible => {
                    return Ok(self.record)
                }
                Phase::Aborting => self.abort().await,
                phase => self.step(phase).await,
            };
            if let Err(error) = result {
                return Err(self.fail(error).await);
            }
        }
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
                    checked?;
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

    /// Back to before the initial copy: the replication dropped and the rows it copied deleted
    /// from the target (it held none of the entity's when the move began: preflight).
    async fn copy_again(&mut self) -> Result<(), Error> {
        self.drop_replication(Step::Sync).await?;
        self.delete_rows_on_target(Step::Sync).await?;
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
        if found.is_some() && (paced || found.as_ref() == Some(&copied_by_mover)) {
            self.drop_replication(Step::Replicate).await?;
        }
        if paced {
            signature = copied_by_mover;
        }
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

    /// A freeze that ran past `max_freeze`, undone with the copy kept: the target fenced as
    /// during the move, the source's fence as before it, the entry back to migrating. The next
    /// freeze follows a new online check: a stream read cut off by the deadline may have consumed
    /// changes the mover never saw.
    async fn unfreeze(&mut self, exceeded: Error) -> Result<(), Error> {
        self.freezes_undone += 1;
        self.tracking = None;
        self.fence_target_during_move().await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Freeze)
            .await?;
        self.directory_step(DirectoryStep::Thaw, Phase::CatchingUp)
            .await?;
        (self.deadline, self.fenced_here) = (None, false);
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

    /// Freezes the entry (its version `F` is what the source's lease admits clients above once
    /// it ends), then fences the source frozen, which waits for its checked writers in flight.
    /// From here an error aborts the move; a source fence that cannot commit undoes the freeze
    /// instead, keeping the copy.
    async fn freeze(&mut self) -> Result<(), Error> {
        if self.record.reversible {
            self.ensure_way_back().await?;
        }
        self.wait_for_open_checks().await?;
        self.deadline = Some(Instant::now() + max_freeze(&self.record));
        self.directory_step(DirectoryStep::Freeze, Phase::Frozen)
            .await?;
        self.fence_source_frozen().await
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
    async fn fence_source_frozen(&mut self) -> Result<(), Error> {
        let deadline = self.deadline.expect("set with the freeze");
        let freeze_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        let lease = self.lease();
        let patience = self
            .options
            .fence_patience
            .min(deadline.saturating_duration_since(Instant::now()));
        let (client, key) = (&self.source.client, &self.key);
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
                let back = match self.record.method {
                    Method::Logical => Phase::CatchingUp,
                    Method::Copy => Phase::Migrating,
                };
                self.directory_step(DirectoryStep::Thaw, back).await?;
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

    /// A freeze this run did not start (resumed, or verified by an earlier run): its lease is
    /// renewed in the directory and the source fenced again, before anything relies on it.
    async fn hold_freeze(&mut self) -> Result<(), Error> {
        let (id, lease) = (self.id(), self.lease());
        let tx = self
            .directory
            .transaction()
            .await
            .at(Step::Freeze, Place::Directory)?;
        let (locked, _) = record::lock(&tx, id)
            .await
            .at(Step::Freeze, Place::Directory)?;
        if locked != self.record.phase {
            drop(tx);
            let expected = self.record.phase;
            self.reload().await?;
            return Err(self.moved_on(expected));
        }
        record::start_freeze(&tx, id, lease)
            .await
            .at(Step::Freeze, Place::Directory)?;
        tx.commit().await.at(Step::Freeze, Place::Directory)?;
        self.fence_source_frozen().await
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

    /// No row may join the entity to another one; and logical apply checks no foreign key (a
    /// copy's COPY does), so after it what the moved rows (`changed`: those changed since the
    /// online check) reference must be on the target.
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
            if self.record.method != Method::Logical {
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
            self.catch_up_and_verify().await?;
        }
        let deadline = self.deadline.expect("a frozen move has a deadline");
        if Instant::now() >= deadline {
            return Err(Error::FreezeExceeded {
                step: Step::Cutover,
                limit: max_freeze(&self.record),
            });
        }
        if self.record.reversible {
            let target = self.target(Step::WayBack)?;
            let name = logical::way_back_name(self.id());
            let skipped = async {
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
        if fence != Fence::Frozen {
            return Err(Error::State {
                move_id: self.id(),
                phase: self.record.phase,
                why: format!(
                    "the source's fence is {fence}, not frozen: someone changed it by hand, and \
                     writes since its catch-up would be lost; the move is undone"
                ),
            });
        }
        self.directory_step(DirectoryStep::Complete, Phase::Cutover)
            .await?;
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
        purge::delete_rows(
            (&mut target.client, &target.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            step,
            |_, _| {},
        )
        .await
    }

    async fn delete_rows_on_source(&mut self) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::DeleteSource, Place::Directory)?;
        let (id, observer) = (self.id(), self.observer.clone());
        let (tables, rates) = (&mut self.record.tables, &mut self.rates);
        purge::delete_rows(
            (&mut self.source.client, &self.source.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            Step::DeleteSource,
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

    /// Back to the start, the entity released first: its source fence as it was and the entry
    /// active on its source, so the freeze ends even when the target is slow or down; then the
    /// target cleaned (replication dropped, the move's rows deleted, its fence as it was).
    pub(crate) async fn abort(&mut self) -> Result<(), Error> {
        let id = self.id();
        if self.record.phase != Phase::Aborting {
            self.enter(Phase::Aborting).await?;
        }
        self.source.end_other_sessions(id).await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Abort)
            .await?;
        self.directory_step(DirectoryStep::Abort, Phase::Aborting)
            .await?;
        self.released = true;
        self.deadline = None;
        let target = self.target(Step::Abort)?;
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
}

fn max_freeze(record: &MoveRecord) -> Duration {
    Duration::from_millis(record.max_freeze_ms.max(0) as u64)
}
