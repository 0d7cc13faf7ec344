//! One process driving one move, phase by phase. Each step reads the real state and may run
//! twice; an error while the entity is frozen aborts the move, any other leaves it resumable.

use std::time::{Duration, Instant};

use shard_directory_client::{EntityKey, State};
use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::copy;
use crate::entry::{self, Placement};
use crate::error::{At, Error, Failure, Left, Place, Step};
use crate::fence::{self, Fence};
use crate::integrity;
use crate::logical;
use crate::mover::Mover;
use crate::phase::Phase;
use crate::purge;
use crate::record::{self, Method, MoveRecord};
use crate::sequences;
use crate::side::Side;
use crate::verify;

pub(crate) fn stopped(move_id: i64, error: Error) -> Failure {
    Failure {
        move_id: Some(move_id),
        error,
        left: Left::Resumable,
        abort_error: None,
    }
}

/// The directory steps a move makes, each committed with the record's phase.
#[derive(Clone, Copy)]
enum DirectoryStep {
    Freeze,
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
    mover: &'m Mover,
    directory: Client,
    pub(crate) record: MoveRecord,
    key: EntityKey,
    source: Side,
    target: Side,
    tables: Vec<EntityTable>,
    /// When the freeze must be over; set when this run froze the entity or resumed it frozen.
    deadline: Option<Instant>,
}

impl<'m> Run<'m> {
    pub(crate) fn new(
        mover: &'m Mover,
        directory: Client,
        record: MoveRecord,
        source: Side,
        target: Side,
        tables: Vec<EntityTable>,
    ) -> Run<'m> {
        let key = record.entity();
        // A resumed frozen move gets a fresh freeze budget: the time it already spent frozen
        // (also while no mover ran) still counts in max_freeze_seen.
        let deadline = matches!(record.phase, Phase::Frozen | Phase::Verified)
            .then(|| Instant::now() + max_freeze(&record));
        Run {
            mover,
            directory,
            record,
            key,
            source,
            target,
            tables,
            deadline,
        }
    }

    fn id(&self) -> i64 {
        self.record.move_id
    }

    pub(crate) async fn drive(mut self) -> Result<MoveRecord, Failure> {
        loop {
            let result = match self.record.phase {
                Phase::Done | Phase::Aborted => return Ok(self.record),
                Phase::Aborting => {
                    return match self.abort().await {
                        Ok(()) => Ok(self.record),
                        Err(e) => Err(stopped(self.id(), e)),
                    }
                }
                phase => self.step(phase).await,
            };
            if let Err(error) = result {
                return Err(self.fail(error).await);
            }
        }
    }

    /// Records the error; a move that holds the entity frozen aborts itself, so the entity is
    /// writable again on its source.
    async fn fail(&mut self, error: Error) -> Failure {
        let id = self.id();
        // Best effort: the directory may be what failed; the error is returned either way.
        let _ = record::set_error(&self.directory, id, &error.to_string()).await;
        self.mover.observer.note(id, &format!("failed: {error}"));
        let frozen = self.deadline.is_some() && self.record.phase.can_abort();
        if !frozen {
            return stopped(id, error);
        }
        match self.abort().await {
            Ok(()) => Failure {
                move_id: Some(id),
                error,
                left: Left::Aborted,
                abort_error: None,
            },
            Err(abort_error) => Failure {
                move_id: Some(id),
                error,
                left: Left::Resumable,
                abort_error: Some(abort_error),
            },
        }
    }

    async fn step(&mut self, phase: Phase) -> Result<(), Error> {
        match (phase, self.record.method) {
            (Phase::Migrating, Method::Logical) => self.enter(Phase::Copying).await,
            (Phase::Migrating, Method::Copy) => self.freeze().await,
            (Phase::Copying, _) => {
                self.replicate().await?;
                self.enter(Phase::CatchingUp).await
            }
            (Phase::CatchingUp, _) => {
                self.wait_for_small_lag().await?;
                self.freeze().await
            }
            (Phase::Frozen, _) => {
                self.catch_up_and_verify().await?;
                self.enter(Phase::Verified).await
            }
            (Phase::Verified, _) => self.cutover().await,
            (Phase::Cutover, _) => {
                let version = self.record.cutover_version.expect("set with the cutover");
                let moved = Fence::Moved {
                    moved_to: self.target.name().to_owned(),
                    version,
                };
                fence::set(&self.source.client, &self.key, &moved)
                    .await
                    .at(Step::FenceSource, self.source.name())?;
                self.enter(Phase::CleaningUp).await
            }
            (Phase::CleaningUp, _) => {
                self.drop_replication(Step::DropReplication).await?;
                if !self.record.keep_source {
                    self.delete_rows_on_source().await?;
                }
                self.enter(Phase::Done).await
            }
            (Phase::Done | Phase::Aborting | Phase::Aborted, _) => {
                unreachable!("drive handles the final phases")
            }
        }
    }

    /// Records `phase`, reloads the record and tells the observer.
    async fn enter(&mut self, phase: Phase) -> Result<(), Error> {
        record::set_phase(&self.directory, self.id(), phase)
            .await
            .at(Step::Record, Place::Directory)?;
        self.entered().await
    }

    async fn entered(&mut self) -> Result<(), Error> {
        self.record = record::load(&self.directory, self.id())
            .await
            .at(Step::Record, Place::Directory)?
            .expect("a move record is never deleted");
        self.mover
            .observer
            .phase(self.record.move_id, self.record.phase)
            .await;
        Ok(())
    }

    /// Runs a directory step unless the entry is already past it, and records `phase` (and the
    /// step's version) in the same directory transaction.
    async fn directory_step(&mut self, step: DirectoryStep, phase: Phase) -> Result<(), Error> {
        let (id, key) = (self.record.move_id, self.key.clone());
        let (source, target) = (
            self.record.source_shard.clone(),
            self.record.target_shard.clone(),
        );
        let err_step = match step {
            DirectoryStep::Freeze => Step::Freeze,
            DirectoryStep::Complete => Step::Cutover,
            DirectoryStep::Abort => Step::Abort,
        };
        let at = |e| Error::Db {
            step: err_step,
            place: Place::Directory,
            source: e,
        };
        let tx = self.directory.transaction().await.map_err(at)?;
        let entry = entry::read(&tx, &key).await.map_err(at)?;
        let toward_target = |e: &Placement| {
            e.shard_name == source && e.target_shard.as_deref() == Some(target.as_str())
        };
        let (call, done) = match (step, &entry) {
            (DirectoryStep::Freeze, Some(e)) if e.state == State::Migrating && toward_target(e) => {
                (Some("SELECT shard_directory.freeze($1, $2)"), None)
            }
            (DirectoryStep::Freeze, Some(e)) if e.state == State::ReadOnly && toward_target(e) => {
                (None, Some(e.version))
            }
            (DirectoryStep::Complete, Some(e))
                if e.state == State::ReadOnly && toward_target(e) =>
            {
                (Some("SELECT shard_directory.complete_move($1, $2)"), None)
            }
            (DirectoryStep::Complete, Some(e))
                if e.state == State::Active && e.shard_name == target =>
            {
                (None, Some(e.version))
            }
            (DirectoryStep::Abort, Some(e)) if e.state != State::Active && toward_target(e) => {
                (Some("SELECT shard_directory.abort_move($1, $2)"), None)
            }
            (DirectoryStep::Abort, Some(e))
                if e.state == State::Active && e.shard_name == source =>
            {
                (None, Some(e.version))
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
        let version = match (call, done) {
            (Some(sql), _) => tx
                .query_one(sql, &[&key.entity_type, &key.entity_id])
                .await
                .map_err(at)?
                .get(0),
            (None, Some(v)) => v,
            (None, None) => unreachable!(),
        };
        let (freeze, cutover) = match step {
            DirectoryStep::Freeze => (Some(version), None),
            DirectoryStep::Complete => (None, Some(version)),
            DirectoryStep::Abort => (None, None),
        };
        record::set_versions(&tx, id, freeze, cutover)
            .await
            .map_err(at)?;
        record::set_phase(&tx, id, phase).await.map_err(at)?;
        tx.commit().await.map_err(at)?;
        self.entered().await
    }

    /// Logical: publication and subscription, then the initial copy of every table.
    async fn replicate(&mut self) -> Result<(), Error> {
        let name = self.record.replication_name.clone();
        logical::ensure_publication(
            &self.source.client,
            &name,
            &self.tables,
            &self.key.entity_id,
        )
        .await
        .at(Step::Replicate, self.source.name())?;
        logical::ensure_subscription(
            &self.source.client,
            &self.target.client,
            &name,
            &self.source.endpoint.replication_conninfo,
        )
        .await
        .at(Step::Replicate, self.target.name())?;
        let started = Instant::now();
        let mut saved = Instant::now();
        loop {
            let state = logical::sync_state(&self.target.client, &name)
                .await
                .at(Step::Sync, self.target.name())?;
            self.check_subscription(&state, Step::Sync)?;
            let id = self.id();
            for (table, ready, copied) in &state.tables {
                if let Some(p) = self.record.tables.get_mut(table) {
                    p.copied = if *ready { p.rows } else { *copied };
                    self.mover.observer.rows(id, table, p.copied, p.rows);
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
                return logical::analyze(&self.target.client, &self.tables)
                    .await
                    .at(Step::Sync, self.target.name());
            }
            self.check_sync_timeout(started, "the initial copy of every table")?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn check_subscription(&self, state: &logical::SyncState, step: Step) -> Result<(), Error> {
        if state.exists && state.enabled {
            return Ok(());
        }
        Err(Error::SubscriptionFailed {
            step,
            name: self.record.replication_name.clone(),
            shard: self.target.name().to_owned(),
            errors: state.errors,
        })
    }

    fn check_sync_timeout(&self, started: Instant, what: &str) -> Result<(), Error> {
        let limit = self.mover.options.sync_timeout;
        if started.elapsed() > limit {
            return Err(Error::Timeout {
                step: Step::Sync,
                what: what.to_owned(),
                after: limit,
            });
        }
        Ok(())
    }

    /// Waits until the slot confirms `lsn`, or `deadline`; returns the confirmed position.
    async fn wait_confirmed(
        &self,
        lsn: &str,
        deadline: Instant,
        on_timeout: impl Fn() -> Error,
    ) -> Result<String, Error> {
        let name = &self.record.replication_name;
        for poll in 0u32.. {
            let (passed, confirmed, behind) = logical::confirmed(&self.source.client, name, lsn)
                .await
                .at(Step::CatchUp, self.source.name())?;
            if passed {
                return Ok(confirmed);
            }
            self.mover.observer.lag(self.id(), behind);
            if Instant::now() >= deadline {
                return Err(on_timeout());
            }
            if poll % 50 == 49 {
                let state = logical::sync_state(&self.target.client, name)
                    .await
                    .at(Step::CatchUp, self.target.name())?;
                self.check_subscription(&state, Step::CatchUp)?;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        unreachable!("the loop returns")
    }

    /// Before freezing: probes until the target catches up with the source within a quarter of
    /// `max_freeze`, so the catch-up under the freeze is expected to fit in it.
    async fn wait_for_small_lag(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        let small = max_freeze(&self.record) / 4;
        let limit = self.mover.options.sync_timeout;
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
            if probe.elapsed() <= small {
                return Ok(());
            }
            let lag = logical::lag_bytes(&self.source.client, &self.record.replication_name)
                .await
                .at(Step::CatchUp, self.source.name())?;
            self.mover.observer.note(
                self.id(),
                &format!(
                    "catch-up took {:?} (lag {lag} bytes); waiting for it to take under {small:?}",
                    probe.elapsed()
                ),
            );
        }
    }

    /// Fences the source `frozen` (waiting for its checked writers in flight), then `freeze`s
    /// the entry. From here an error aborts the move.
    async fn freeze(&mut self) -> Result<(), Error> {
        record::start_freeze(&self.directory, self.id())
            .await
            .at(Step::Freeze, Place::Directory)?;
        self.deadline = Some(Instant::now() + max_freeze(&self.record));
        fence::set(&self.source.client, &self.key, &Fence::Frozen)
            .await
            .at(Step::Freeze, self.source.name())?;
        self.directory_step(DirectoryStep::Freeze, Phase::Frozen)
            .await
    }

    /// Under the freeze: catch up (logical) or copy, verify, advance sequences, fence the target.
    async fn catch_up_and_verify(&mut self) -> Result<(), Error> {
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
        let counts = within(
            deadline,
            limit,
            Step::Verify,
            verify::verify(
                (&self.source.client, self.source.name()),
                (&self.target.client, self.target.name()),
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
        // No row may join the entity to another one; and logical apply checks no foreign key
        // (a copy's COPY does), so after it what the moved rows reference must be on the target.
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
                &self.target.client,
                self.target.name(),
                &self.tables,
                &self.key,
            )
            .await
        })
        .await?;
        within(
            deadline,
            limit,
            Step::Sequences,
            sequences::advance(
                (&self.source.client, self.source.name()),
                (&self.target.client, self.target.name()),
                &self.tables,
            ),
        )
        .await?;
        let min_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        fence::set(
            &self.target.client,
            &self.key,
            &Fence::Owned { min_version },
        )
        .await
        .at(Step::FenceTarget, self.target.name())
    }

    /// Method copy: the entity's rows, over connections of their own (a copy cut off by the
    /// deadline leaves them mid-stream; an abort ends them).
    async fn copy(&self) -> Result<(), Error> {
        let mut read = self.source.another(self.id()).await?;
        let mut write = self.target.another(self.id()).await?;
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Copy, Place::Directory)?;
        let (id, observer, record) = (self.id(), &self.mover.observer, &self.record);
        copy::copy_rows(
            (&mut read, self.source.name()),
            (&mut write, self.target.name()),
            &self.tables,
            &self.key,
            version,
            |table, rows| {
                let total = record.tables.get(table).map_or(rows as i64, |p| p.rows);
                observer.rows(id, table, rows as i64, total);
            },
        )
        .await
    }

    /// `complete_move`, unless the freeze has run out: the point of no return.
    async fn cutover(&mut self) -> Result<(), Error> {
        let deadline = self.deadline.expect("a frozen move has a deadline");
        if Instant::now() >= deadline {
            return Err(Error::FreezeExceeded {
                step: Step::Cutover,
                limit: max_freeze(&self.record),
            });
        }
        self.directory_step(DirectoryStep::Complete, Phase::Cutover)
            .await?;
        self.deadline = None;
        Ok(())
    }

    async fn drop_replication(&self, step: Step) -> Result<(), Error> {
        if self.record.method != Method::Logical {
            return Ok(());
        }
        let name = &self.record.replication_name;
        logical::drop_subscription(&self.target.client, name)
            .await
            .at(step, self.target.name())?;
        logical::drop_publication(&self.source.client, name)
            .await
            .at(step, self.source.name())
    }

    async fn delete_rows_on_source(&mut self) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::DeleteSource, Place::Directory)?;
        let (id, observer) = (self.id(), self.mover.observer.clone());
        let tables = &mut self.record.tables;
        purge::delete_rows(
            (&mut self.source.client, &self.source.endpoint.name),
            &self.tables,
            &self.key,
            version,
            self.mover.options.delete_batch,
            Step::DeleteSource,
            |table, deleted| {
                if let Some(p) = tables.get_mut(table) {
                    p.deleted = deleted as i64;
                    observer.rows(id, table, p.deleted, p.rows);
                }
            },
        )
        .await?;
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// Back to the start: replication dropped, the entity's rows on the target deleted, both
    /// fences as they were, the entry active on the source.
    pub(crate) async fn abort(&mut self) -> Result<(), Error> {
        let id = self.id();
        if self.record.phase != Phase::Aborting {
            self.enter(Phase::Aborting).await?;
        }
        for side in [&self.source, &self.target] {
            side.end_other_sessions(id).await?;
        }
        self.drop_replication(Step::Abort).await?;
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Abort, Place::Directory)?;
        // The target held none of the entity's rows when the move began (preflight): all there
        // are the move's.
        purge::delete_rows(
            (&mut self.target.client, &self.target.endpoint.name),
            &self.tables,
            &self.key,
            version,
            self.mover.options.delete_batch,
            Step::Abort,
            |_, _| {},
        )
        .await?;
        fence::set(&self.target.client, &self.key, &self.record.target_fence)
            .await
            .at(Step::Abort, self.target.name())?;
        fence::set(&self.source.client, &self.key, &self.record.source_fence)
            .await
            .at(Step::Abort, self.source.name())?;
        self.directory_step(DirectoryStep::Abort, Phase::Aborted)
            .await?;
        self.deadline = None;
        Ok(())
    }
}

fn max_freeze(record: &MoveRecord) -> Duration {
    Duration::from_millis(record.max_freeze_ms.max(0) as u64)
}
