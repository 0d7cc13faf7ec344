//! The `Mover`: starts, resumes and aborts moves. Each step reads the real state (the directory
//! entry, the fences, the replication catalogs) and is safe to run twice, so a move that stopped
//! anywhere, crashed or killed, continues with `resume` or returns to its start with `abort`.
//!
//! Order of a move (DESIGN.md, "Moves"): `begin_move` -> copy (and stream) -> lag small -> fence
//! `frozen` on the source and `freeze` the entry -> source WAL position taken after the fence
//! commits -> target confirmed past it -> verify -> sequences -> target fenced `owned` ->
//! `complete_move` with the source fenced `cutover` inside its directory transaction (the point
//! of no return) -> source fenced `moved` -> replication objects dropped -> source rows deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shard_directory_protocol::EntityKey;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use crate::directory::entry::{self, HistoryRow, Placement};
use crate::directory::phase::Phase;
use crate::directory::record::{self, MoveRecord, NewMove, TableProgress};
use crate::directory::registry::{self, Overrides};
use crate::error::{At, Error, Failure, Place, Step};
use crate::failpoint::point;
use crate::options::MoveOptions;
use crate::patience::{Retry, Verdict, Wait};
use crate::preflight::{preflight, Plan};
use crate::reconcile::Stray;
use crate::report::observer::{LogObserver, Observer};
use crate::report::telemetry::Metered;
use crate::run::checks::verify;
use crate::run::replication::logical;
use crate::run::{stopped, Run};
use crate::shards::catalog;
use crate::shards::side::{self, Side};
use crate::status::{self, MoveStatus};

/// Class of the session advisory lock a run holds on its move (`pg_advisory_lock(int, int)`).
pub(crate) const MOVE_LOCK_CLASS: i32 = 0x5344_4d56;

/// Starts, resumes, aborts and inspects moves. Holds no connection: each call opens its own, so
/// one `Mover` may run several moves at once.
pub struct Mover {
    directory: Config,
    pub(crate) overrides: Overrides,
    pub(crate) options: MoveOptions,
    pub(crate) observer: Arc<dyn Observer>,
    /// The directory session (backend pid) that took each move's lock in this process: after a
    /// network blip the server may keep that session, and the lock, until it notices the client
    /// is gone; a run of this process ends it rather than waiting for it.
    held: Arc<Mutex<BTreeMap<i64, i32>>>,
}

impl Mover {
    /// A mover over the directory database at `directory`. `options` apply to the moves it
    /// starts (a resumed move keeps its own method, `max_freeze` and `keep_source`).
    pub fn new(directory: Config, overrides: Overrides, options: MoveOptions) -> Mover {
        Mover {
            directory: shard_directory_connect::with_password(directory),
            overrides,
            options,
            observer: Arc::new(Metered::new(Arc::new(LogObserver))),
            held: Arc::default(),
        }
    }

    /// A mover like this one whose moves are made with `options`.
    pub(crate) fn using(&self, options: MoveOptions) -> Mover {
        Mover {
            directory: self.directory.clone(),
            overrides: self.overrides.clone(),
            options,
            observer: self.observer.clone(),
            held: self.held.clone(),
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Mover {
        self.observer = Arc::new(Metered::new(observer));
        self
    }

    pub(crate) async fn connect_directory(&self, move_id: Option<i64>) -> Result<Client, Error> {
        registry::connect(
            &self.directory,
            &side::application_name(move_id),
            Place::Directory,
        )
        .await
    }

    /// Checks that `key` can move to `target` and says how, with how long its comparison and its
    /// freeze should take, changing nothing.
    pub async fn plan(&self, key: &EntityKey, target: &str) -> Result<Plan, Error> {
        let directory = self.connect_directory(None).await?;
        let (mut plan, tables, source, _) =
            preflight(&directory, &self.overrides, &self.options, key, target).await?;
        let full_check =
            verify::estimate((&source.client, source.name()), &tables, &plan.tables, key).await?;
        plan.estimate(full_check, &self.options);
        Ok(plan)
    }

    /// Starts a move of `key` to `target` and runs it to the end.
    pub async fn start(&self, key: &EntityKey, target: &str) -> Result<MoveRecord, Failure> {
        self.start_in(key, target, None).await
    }

    /// [`Mover::start`], the move recorded as one of batch `batch_id`'s.
    pub(crate) async fn start_in(
        &self,
        key: &EntityKey,
        target: &str,
        batch_id: Option<i64>,
    ) -> Result<MoveRecord, Failure> {
        let mut retry = Retry::new(Wait {
            patience: self.options.directory_patience,
            from_call: true,
            whole_pauses: false,
        });
        let mut warned = false;
        loop {
            // Only a start that stopped before its move was recorded (no move id) is started
            // again; a recorded one waits out its outages as every move does.
            let failure = match self.start_once(key, target, batch_id).await {
                Err(f) if f.move_id.is_none() && f.error.lost_directory() => f,
                ran => return self.through_outages(ran).await,
            };
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!(entity = %key, error = %failure.error,
                    "the directory stopped answering before the move was recorded; starting once it answers");
            }
            if !retry.again(Verdict::Again).await {
                return Err(failure);
            }
            // The move may have been recorded before the directory went, unacknowledged: an
            // open move of the entity to the target is this one (resume refuses it if another
            // process drives it).
            if let Ok(Some(id)) = self.open_move_of(key, target).await {
                return self.resume(id).await;
            }
        }
    }

    /// The open move of `key` to `target`, if any.
    async fn open_move_of(&self, key: &EntityKey, target: &str) -> Result<Option<i64>, Error> {
        let directory = self.connect_directory(None).await?;
        let row = directory
            .query_opt(
                "SELECT move_id FROM shard_directory.shard_moves \
                 WHERE entity_type = $1 AND entity_id = $2 AND target_shard = $3 \
                   AND finished_at IS NULL",
                &[&key.entity_type, &key.entity_id, &target],
            )
            .await
            .at(Step::Record, Place::Directory)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn start_once(
        &self,
        key: &EntityKey,
        target: &str,
        batch_id: Option<i64>,
    ) -> Result<MoveRecord, Failure> {
        let directory = self
            .connect_directory(None)
            .await
            .map_err(Failure::untouched)?;
        let checked = preflight(&directory, &self.overrides, &self.options, key, target)
            .await
            .map_err(Failure::untouched)?;
        self.launch(directory, checked, &self.options, batch_id, None)
            .await
    }

    /// Moves the entity of reversible move `move_id` back to where it came from: a move the
    /// other way whose replication is the way back, so it copies nothing and freezes only for
    /// its catch-up and check, within the move's own `max_freeze`. Aborted, it leaves the move
    /// reversible as it was.
    pub async fn revert(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let directory = self
            .connect_directory(None)
            .await
            .map_err(Failure::untouched)?;
        let reversible = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)
            .and_then(|r| r.ok_or(Error::UnknownMove(move_id)))
            .map_err(Failure::untouched)?;
        let checked = crate::preflight::revert(&directory, &self.overrides, &reversible)
            .await
            .map_err(Failure::untouched)?;
        // The way back is bounded as the move was: its freeze by the move's `--max-freeze`.
        let options = MoveOptions {
            reversible: false,
            reversible_for: None,
            keep_source: false,
            max_freeze: Duration::from_millis(reversible.max_freeze_ms.max(0) as u64),
            ..self.options.clone()
        };
        let ran = self
            .launch(directory, checked, &options, None, Some(move_id))
            .await;
        self.through_outages(ran).await
    }

    /// Ends reversible move `move_id` where it is: drops its way back and deletes the entity's
    /// rows on its source (unless it was made with `--keep-source`). Refused while a revert of it
    /// is under way.
    pub async fn finalize(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let directory = self
            .connect_directory(Some(move_id))
            .await
            .map_err(|e| not_opened(move_id, e))?;
        let reverting = directory
            .query_opt(
                "SELECT move_id FROM shard_directory.shard_moves \
                 WHERE reverses = $1 AND finished_at IS NULL",
                &[&move_id],
            )
            .await
            .at(Step::Record, Place::Directory)
            .map_err(|e| not_opened(move_id, e))?;
        if let Some(row) = reverting {
            let revert: i64 = row.get(0);
            return Err(Failure::untouched(Error::State {
                move_id,
                phase: Phase::Reversible,
                why: format!(
                    "move {revert} is reverting it: `shard-directory abort {revert}` first, or let \
                     it finish"
                ),
            }));
        }
        let finalized = async {
            point!("finalize.record");
            Ok::<_, Error>(record::finalize(&directory, move_id).await)
        };
        match finalized.await.map_err(Failure::untouched)? {
            Ok(true) => {}
            Ok(false) => {
                let record = self.status(move_id).await.map_err(Failure::untouched)?;
                if record.finalized_at.is_none() || record.phase.is_finished() {
                    return Err(Failure::untouched(Error::State {
                        move_id,
                        phase: record.phase,
                        why: "only a reversible move (made with --reversible, not reverted) can \
                              be finalized"
                            .into(),
                    }));
                }
                // Finalized before and stopped on the way: it goes on.
            }
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                return Err(Failure::untouched(Error::State {
                    move_id,
                    phase: Phase::Reversible,
                    why: "a revert of it has just begun: abort it first, or let it finish".into(),
                }))
            }
            Err(e) => {
                return Err(Failure::untouched(Error::Db {
                    step: Step::Record,
                    place: Place::Directory,
                    source: e,
                }))
            }
        }
        // A source that is gone keeps no finalize from releasing the target's WAL.
        let gone = self.source_gone(&directory, move_id).await;
        drop(directory);
        match gone.map_err(|e| not_opened(move_id, e))? {
            Some(why) => self.finalize_without_source(move_id, why).await,
            None => self.resume(move_id).await,
        }
    }

    /// Finalizes every reversible move whose `--reversible-for` has run out; each one's outcome.
    pub async fn finalize_expired(&self) -> Result<Vec<Result<MoveRecord, Failure>>, Error> {
        let expired = self.read(async |c| record::expired(c).await).await?;
        let mut done = Vec::new();
        for id in expired {
            done.push(self.finalize(id).await);
        }
        Ok(done)
    }

    /// Records a move that preflight found possible and runs it to the end.
    async fn launch(
        &self,
        mut directory: Client,
        (plan, tables, source, target): (Plan, Vec<catalog::EntityTable>, Side, Side),
        options: &MoveOptions,
        batch_id: Option<i64>,
        reverses: Option<i64>,
    ) -> Result<MoveRecord, Failure> {
        let progress: BTreeMap<String, TableProgress> = plan
            .tables
            .iter()
            .map(|(t, rows)| {
                let p = TableProgress {
                    rows: *rows,
                    ..Default::default()
                };
                (t.clone(), p)
            })
            .collect();
        let move_id = begin(
            &mut directory,
            &plan,
            options,
            &progress,
            batch_id,
            reverses,
        )
        .await
        .map_err(Failure::untouched)?;
        let begun = Some(Phase::Migrating);
        self.locked(&directory, move_id)
            .await
            .map_err(|e| stopped(move_id, e, begun))?;
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)
            .map_err(|e| stopped(move_id, e, begun))?
            .expect("just inserted");
        for side in [&source, &target] {
            side.name_after(move_id)
                .await
                .map_err(|e| stopped(move_id, e, begun))?;
        }
        side::name_session(&directory, move_id)
            .await
            .at(Step::Connect, Place::Directory)
            .map_err(|e| stopped(move_id, e, begun))?;
        for warning in &plan.warnings {
            self.observer.note(move_id, &format!("warning: {warning}"));
        }
        self.observer.phase(move_id, record.phase).await;
        Run::new(self, options, directory, record, source, Ok(target), tables)
            .drive()
            .await
    }

    /// Continues move `move_id` from where its record and the real state say it is.
    pub async fn resume(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let ran = self.resume_once(move_id).await;
        self.through_outages(ran).await
    }

    /// A move that stopped because its directory stopped answering is resumed once the
    /// directory answers again (a multi-host conninfo reaches the standby promoted in its
    /// place), for up to `directory_patience` from when it stopped (again from each outage a
    /// resumed move meets further on). Every step reads the real state again, so one that was
    /// under way when the directory went is redone or skipped.
    async fn through_outages(
        &self,
        mut ran: Result<MoveRecord, Failure>,
    ) -> Result<MoveRecord, Failure> {
        let patience = self.options.directory_patience;
        if patience.is_zero() {
            return ran;
        }
        let mut retry = Retry::new(Wait {
            patience,
            from_call: false,
            whole_pauses: false,
        });
        // The phase the current outage stopped the move in; a resume that stopped in another
        // phase met a new outage, with a patience of its own.
        let mut outage: Option<Option<Phase>> = None;
        loop {
            let failure = match ran {
                Err(failure) => failure,
                done => return done,
            };
            // Busy while resuming after an outage: the lock may still be held by a session the
            // server has not yet found gone (not this process's: `lock_move` ends those).
            let busy = outage.is_some() && matches!(failure.error, Error::Busy { .. });
            if !failure.lost_directory() && !busy {
                return Err(failure);
            }
            let move_id = failure.move_id.expect("a lost directory names its move");
            // A resume that could not read the record knows no phase: the same outage.
            let verdict = match outage {
                Some(phase) if failure.phase.is_none_or(|p| Some(p) == phase) => {
                    outage = Some(failure.phase.or(phase));
                    Verdict::Again
                }
                _ => {
                    self.observer.note(
                        move_id,
                        &format!(
                            "the directory stopped answering ({}); resuming once it answers, \
                             for up to {patience:?}",
                            failure.error
                        ),
                    );
                    outage = Some(failure.phase);
                    Verdict::Anew
                }
            };
            if !retry.again(verdict).await {
                return Err(failure);
            }
            ran = self.resume_once(move_id).await;
        }
    }

    async fn resume_once(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let run = self
            .open(move_id)
            .await
            .map_err(|e| not_opened(move_id, e))?;
        // An aborted move is reported as the failure it is (`Left::Aborted`).
        run.drive().await
    }

    /// Returns move `move_id` to its start (entry active on the source, fences as they were, the
    /// entity's rows on the target deleted, replication objects dropped). Refused once the move
    /// has passed `complete_move`: from there only forward.
    pub async fn abort(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let mut run = self
            .open(move_id)
            .await
            .map_err(|e| not_opened(move_id, e))?;
        let phase = run.record.phase;
        match phase {
            Phase::Aborted => Ok(run.record),
            p if p.can_abort() => match run.abort().await {
                Ok(()) => Ok(run.record),
                Err(e) => Err(run.failure(e)),
            },
            p => Err(stopped(
                move_id,
                Error::State {
                    move_id,
                    phase: p,
                    why: format!(
                        "past its cutover (complete_move at version {}): only forward; \
                         `shard-directory resume {move_id}` finishes it",
                        run.record
                            .cutover_version
                            .map_or("?".to_owned(), |v| v.to_string())
                    ),
                },
                Some(p),
            )),
        }
    }

    /// Locks the move for this process and connects to both of its shards.
    async fn open(&self, move_id: i64) -> Result<Run<'_>, Error> {
        let directory = self.connect_directory(Some(move_id)).await?;
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        if matches!(record.phase, Phase::Done | Phase::Reverted) {
            return Err(Error::State {
                move_id,
                phase: record.phase,
                why: format!("the move is {}", record.phase),
            });
        }
        self.lock_move(&directory, move_id).await?;
        // Read again under the lock: the run that held it may have moved the phase on.
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .expect("a move record is never deleted");
        let endpoint =
            registry::endpoint(&directory, &self.overrides, &record.source_shard).await?;
        let source = Side::connect(endpoint, Some(move_id)).await?;
        // A target that is down does not keep an abort from releasing the entity on its source.
        let endpoint =
            registry::endpoint(&directory, &self.overrides, &record.target_shard).await?;
        let target = Side::connect(endpoint, Some(move_id))
            .await
            .map_err(|e| e.to_string());
        let tables = catalog::describe(&source.client, &record.entity_type)
            .await
            .at(Step::Preflight, source.name())?;
        Ok(Run::new(
            self,
            &self.options,
            directory,
            record,
            source,
            target,
            tables,
        ))
    }

    /// Takes move `move_id`'s lock on `directory`'s session, or names who holds it. A run that
    /// just crashed may hold it until the server notices its session is gone: tried for 5 s. A
    /// session of this process that took it before (its connection lost while the server kept
    /// it) is ended at once.
    pub(crate) async fn lock_move(&self, directory: &Client, move_id: i64) -> Result<(), Error> {
        let at = |e| Error::Db {
            step: Step::Record,
            place: Place::Directory,
            source: e,
        };
        let key = lock_key(move_id);
        for _ in 0..50 {
            let locked: bool = directory
                .query_one(
                    "SELECT pg_try_advisory_lock($1, $2)",
                    &[&MOVE_LOCK_CLASS, &key],
                )
                .await
                .map_err(at)?
                .get(0);
            if locked {
                return self.locked(directory, move_id).await;
            }
            let holder = status::driver(directory, MOVE_LOCK_CLASS, key)
                .await
                .map_err(at)?;
            let ours = self.held.lock().expect("held").get(&move_id).copied();
            if let Some(pid) = holder.as_ref().map(|h| h.pid).filter(|p| Some(*p) == ours) {
                directory
                    .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
                    .await
                    .map_err(at)?;
                continue;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let holder = status::driver(directory, MOVE_LOCK_CLASS, key)
            .await
            .map_err(at)?;
        Err(Error::Busy {
            move_id,
            holder: holder.map_or_else(
                || "a session that has just ended".to_owned(),
                |d| d.to_string(),
            ),
        })
    }

    /// Remembers that `directory`'s session holds move `move_id`'s lock.
    pub(crate) async fn locked(&self, directory: &Client, move_id: i64) -> Result<(), Error> {
        let pid: i32 = directory
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .at(Step::Record, Place::Directory)?
            .get(0);
        self.held.lock().expect("held").insert(move_id, pid);
        Ok(())
    }

    /// Runs one read on a new directory connection.
    async fn read<T, E>(&self, query: impl AsyncFnOnce(&Client) -> Result<T, E>) -> Result<T, Error>
    where
        Result<T, E>: At<T>,
    {
        let directory = self.connect_directory(None).await?;
        query(&directory).await.at(Step::Record, Place::Directory)
    }

    pub async fn status(&self, move_id: i64) -> Result<MoveRecord, Error> {
        self.read(async |c| record::load(c, move_id).await)
            .await?
            .ok_or(Error::UnknownMove(move_id))
    }

    /// The record, the process driving the move (if one is) and its slot on the source (while
    /// it exists; a source that cannot be reached is left out).
    pub async fn status_detail(&self, move_id: i64) -> Result<MoveStatus, Error> {
        let directory = self.connect_directory(None).await?;
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        let driver = status::driver(&directory, MOVE_LOCK_CLASS, lock_key(move_id))
            .await
            .at(Step::Record, Place::Directory)?;
        let mut slot = None;
        let mut way_back_stopped_by = None;
        if let Some((shard, name)) = status::slot_of(&record) {
            if let Some(side) = self.reach(&directory, shard).await {
                slot = status::slot(&side.client, side.name(), &name)
                    .await
                    .at(Step::Record, side.name())?;
                let stopped = slot.as_ref().is_some_and(|s| !s.active);
                if record.phase == Phase::Reversible && stopped {
                    way_back_stopped_by =
                        self.way_back_stopped_by(&directory, &record, &side).await;
                }
            }
        }
        Ok(MoveStatus {
            schema_version: status::SCHEMA_VERSION,
            record,
            driver,
            slot,
            way_back_stopped_by,
        })
    }

    /// A session on `shard`, or none while it cannot be reached.
    async fn reach(&self, directory: &Client, shard: &str) -> Option<Side> {
        let endpoint = registry::endpoint(directory, &self.overrides, shard)
            .await
            .ok()?;
        Side::connect(endpoint, None).await.ok()
    }

    /// The value that stops `record`'s way back (`target` its way back's start), if one does;
    /// what keeps it from being read is logged, not returned: `status` still answers.
    async fn way_back_stopped_by(
        &self,
        directory: &Client,
        record: &MoveRecord,
        target: &Side,
    ) -> Option<status::way_back::Unreadable> {
        let source = self.reach(directory, &record.source_shard).await?;
        let name = logical::way_back_name(record.move_id);
        status::way_back::unreadable(&target.client, &source.client, &name)
            .await
            .unwrap_or_else(|err| {
                tracing::warn!(
                    target: "shard_directory_mover::status",
                    "move {}: what stops its way back cannot be read: {err}",
                    record.move_id
                );
                None
            })
    }

    /// Every move, newest first: only the open ones with `open_only`, only those started at or
    /// after `since` (any timestamptz input) with it.
    pub async fn list(
        &self,
        open_only: bool,
        since: Option<&str>,
    ) -> Result<Vec<MoveRecord>, Error> {
        self.read(async |c| record::list(c, open_only, since).await)
            .await
    }

    /// Every move of `key`, newest first.
    pub async fn moves_of(&self, key: &EntityKey) -> Result<Vec<MoveRecord>, Error> {
        self.read(async |c| record::of_entity(c, key).await).await
    }

    /// Every open move, and every move finished at or after `since`, on a directory session the
    /// caller holds (the console reads them on every change, on its one session).
    pub async fn open_or_finished_since(
        directory: &Client,
        since: &str,
    ) -> Result<Vec<MoveRecord>, Error> {
        record::open_or_finished_since(directory, since)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// Sessions on the shards to read open moves' slots from, again and again (the console's
    /// live list).
    pub fn slots(&self) -> status::slots::Slots {
        status::slots::Slots::new(self.overrides.clone())
    }

    /// Every entity with rows on `shard` (of `entity_type`, or of any type protected there)
    /// whose directory entry names another shard, or that has no entry. Reads every protected
    /// table of the shard whole.
    pub async fn strays(
        &self,
        shard: &str,
        entity_type: Option<&str>,
    ) -> Result<Vec<Stray>, Error> {
        let directory = self.connect_directory(None).await?;
        let endpoint = registry::endpoint(&directory, &self.overrides, shard).await?;
        let side = Side::connect(endpoint, None).await?;
        crate::reconcile::strays(&directory, &side.client, shard, entity_type).await
    }

    /// Compares `key`'s rows on the shard the directory names with its rows on `other`, as a
    /// move verifies them (count and hash per table; the differing keys named): the rows per
    /// table when they agree, `Error::Mismatch` when not.
    pub async fn compare(&self, key: &EntityKey, other: &str) -> Result<Vec<(String, i64)>, Error> {
        let directory = self.connect_directory(None).await?;
        let Some(entry) = entry::read(&directory, key)
            .await
            .at(Step::Verify, Place::Directory)?
        else {
            return Err(Error::Preflight {
                problem: format!("no directory entry for {key}"),
                fix: "check the entity type and id".into(),
            });
        };
        let mut sides = Vec::new();
        for shard in [entry.shard_name.as_str(), other] {
            let endpoint = registry::endpoint(&directory, &self.overrides, shard).await?;
            sides.push(Side::connect(endpoint, None).await?);
        }
        let (home, there) = (&sides[0], &sides[1]);
        let tables = catalog::describe(&home.client, &key.entity_type)
            .await
            .at(Step::Verify, home.name())?;
        crate::run::checks::verify::verify(
            (&home.client, home.name()),
            (&there.client, there.name()),
            &tables,
            key,
        )
        .await
    }

    /// Deletes the entity's rows a finished `--keep-source` move left on its source (fenced
    /// `moved` there, so nobody read or wrote them since), in batches through the fence bypass.
    pub async fn purge_source(&self, move_id: i64) -> Result<MoveRecord, Error> {
        let directory = self.connect_directory(Some(move_id)).await?;
        let mut record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        if record.phase != Phase::Done || !record.keep_source {
            return Err(Error::State {
                move_id,
                phase: record.phase,
                why: "only a finished move made with --keep-source left rows on its source".into(),
            });
        }
        let endpoint =
            registry::endpoint(&directory, &self.overrides, &record.source_shard).await?;
        let mut source = Side::connect(endpoint, Some(move_id)).await?;
        let key = record.entity();
        let fence = crate::shards::fence::read(&source.client, &key)
            .await
            .at(Step::DeleteSource, source.name())?;
        if !matches!(fence, crate::shards::fence::Fence::Moved { .. }) {
            return Err(Error::State {
                move_id,
                phase: record.phase,
                why: format!(
                    "{key} is fenced {fence} on shard {}, not moved: it may live there again; \
                     nothing was deleted",
                    source.name()
                ),
            });
        }
        let tables = catalog::describe(&source.client, &key.entity_type)
            .await
            .at(Step::DeleteSource, source.name())?;
        let version = entry::current_version(&directory)
            .await
            .at(Step::DeleteSource, Place::Directory)?;
        let replica = crate::run::copy::triggers::delete_as_replica(
            &source.client,
            &source.endpoint.name,
            &tables,
            Step::DeleteSource,
        )
        .await;
        let progress = &mut record.tables;
        crate::run::cleanup::purge::delete_rows(
            (&mut source.client, &source.endpoint.name),
            &tables,
            &key,
            version,
            &mut self.options.throttle(),
            Step::DeleteSource,
            replica,
            |table, deleted| {
                if let Some(p) = progress.get_mut(table) {
                    p.deleted = deleted as i64;
                }
            },
        )
        .await?;
        record::set_tables(&directory, move_id, &record.tables)
            .await
            .at(Step::Record, Place::Directory)?;
        Ok(record)
    }

    /// The entity's entry now.
    pub async fn placement(&self, key: &EntityKey) -> Result<Option<Placement>, Error> {
        self.read(async |c| entry::read(c, key).await).await
    }

    /// The entity's shard (as its entry names it) and its rows and bytes in each of its tables
    /// there, counted whole within `within` (the shard's `statement_timeout`); `None` without an
    /// entry.
    pub async fn entity_tables(
        &self,
        key: &EntityKey,
        within: Duration,
    ) -> Result<Option<(String, Vec<crate::TableSize>)>, Error> {
        let directory = self.connect_directory(None).await?;
        let Some(placed) = entry::read(&directory, key)
            .await
            .at(Step::Plan, Place::Directory)?
        else {
            return Ok(None);
        };
        let side = self.connect_shard(&directory, &placed.shard_name).await?;
        let timeout = format!("SET statement_timeout = {}", within.as_millis());
        side.client
            .batch_execute(&timeout)
            .await
            .at(Step::Plan, side.name())?;
        let sizes = crate::planning::sizes::of_entity(&side.client, side.name(), key).await?;
        Ok(Some((placed.shard_name, sizes)))
    }

    /// The shard that held the entity at `at` (any timestamptz input), from history.
    pub async fn placement_at(&self, key: &EntityKey, at: &str) -> Result<Option<String>, Error> {
        self.read(async |c| entry::placement_at(c, key, at).await)
            .await
    }

    pub async fn history(&self, key: &EntityKey) -> Result<Vec<HistoryRow>, Error> {
        self.read(async |c| entry::history(c, key).await).await
    }

    /// Drops replication objects (`sd_move_<id>`) left on any registered shard by moves that
    /// are finished, aborted, or unknown to the directory, and tablesync slots whose subscription
    /// is gone from its subscriber. Returns what it dropped; shards it cannot reach are skipped
    /// with a note. A move that starts while this runs has an id above every one it considers,
    /// and a move's record is read again just before its objects are dropped.
    pub async fn cleanup(&self) -> Result<Vec<String>, Error> {
        let directory = self.connect_directory(None).await?;
        let at = |e| Error::Db {
            step: Step::Cleanup,
            place: Place::Directory,
            source: e,
        };
        let newest: i64 = directory
            .query_one(
                "SELECT coalesce(max(move_id), 0) FROM shard_directory.shard_moves",
                &[],
            )
            .await
            .map_err(at)?
            .get(0);
        let open_now = "SELECT EXISTS (SELECT 1 FROM shard_directory.shard_moves \
                        WHERE move_id = $1 AND finished_at IS NULL)";
        let shards: Vec<String> = directory
            .query(
                "SELECT shard_name FROM shard_directory.shards ORDER BY shard_name",
                &[],
            )
            .await
            .map_err(at)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut reachable = Vec::new();
        for shard in shards {
            let side = match registry::endpoint(&directory, &self.overrides, &shard).await {
                Ok(endpoint) => Side::connect(endpoint, None).await,
                Err(e) => Err(e),
            };
            match side {
                Ok(side) => reachable.push(side),
                Err(e) => self
                    .observer
                    .note(0, &format!("cleanup skips shard {shard}: {e}")),
            }
        }
        let mut dropped = Vec::new();
        // Subscriptions first: each holds a slot on another shard.
        for pass in ["subscription", "slot", "publication"] {
            for side in &reachable {
                let objects = logical::objects(&side.client)
                    .await
                    .at(Step::Cleanup, side.name())?;
                for (kind, name) in objects {
                    let id = name
                        .trim_start_matches("sd_move_")
                        .trim_end_matches("_track")
                        .trim_end_matches("_back")
                        .parse::<i64>()
                        .ok();
                    let Some(id) = id.filter(|id| kind == pass && *id <= newest) else {
                        continue;
                    };
                    let open: bool = directory
                        .query_one(open_now, &[&id])
                        .await
                        .map_err(at)?
                        .get(0);
                    if open {
                        continue;
                    }
                    match pass {
                        "subscription" => logical::drop_subscription(&side.client, &name).await,
                        "slot" => logical::drop_slot(&side.client, &name).await,
                        _ => logical::drop_publication(&side.client, &name).await,
                    }
                    .at(Step::Cleanup, side.name())?;
                    dropped.push(format!("{kind} {name} on {}", side.name()));
                }
            }
        }
        // Tablesync slots name their subscriber (its system identifier) and subscription.
        let mut subscribers = Vec::new();
        for side in &reachable {
            let sysid = logical::system_identifier(&side.client)
                .await
                .at(Step::Cleanup, side.name())?;
            subscribers.push((sysid, side));
        }
        for side in &reachable {
            let slots = logical::tablesync_slots(&side.client)
                .await
                .at(Step::Cleanup, side.name())?;
            for (slot, subscription, sysid) in slots {
                let Some((_, subscriber)) = subscribers.iter().find(|(s, _)| *s == sysid) else {
                    continue;
                };
                let present = logical::subscription_oids(&subscriber.client)
                    .await
                    .at(Step::Cleanup, subscriber.name())?;
                if present.contains(&subscription) {
                    continue;
                }
                logical::drop_slot(&side.client, &slot)
                    .await
                    .at(Step::Cleanup, side.name())?;
                dropped.push(format!(
                    "slot {slot} on {} (its subscription on {} is gone)",
                    side.name(),
                    subscriber.name()
                ));
            }
        }
        Ok(dropped)
    }
}

/// The record, `begin_move` and the run's lock on the move, in one directory transaction.
async fn begin(
    directory: &mut Client,
    plan: &Plan,
    options: &MoveOptions,
    tables: &BTreeMap<String, TableProgress>,
    batch_id: Option<i64>,
    reverses: Option<i64>,
) -> Result<i64, Error> {
    let at = |e| Error::Db {
        step: Step::Begin,
        place: Place::Directory,
        source: e,
    };
    let tx = directory.transaction().await.map_err(at)?;
    if let Some(reversible) = reverses {
        // Held to commit: a finalize of the move waits, and then finds this revert open.
        let (phase, _) = record::lock(&tx, reversible).await.map_err(at)?;
        if phase != Phase::Reversible {
            return Err(Error::State {
                move_id: reversible,
                phase,
                why: "it is no longer reversible".into(),
            });
        }
    }
    let inserted = record::insert(
        &tx,
        &NewMove {
            entity: &plan.entity,
            source: &plan.source,
            target: &plan.target,
            method: plan.method,
            keep_source: options.keep_source,
            max_freeze: options.max_freeze,
            source_fence: &plan.source_fence,
            target_fence: &plan.target_fence,
            tables,
            batch_id,
            reversible: options.reversible,
            reversible_for: options.reversible_for,
            reverses,
        },
    )
    .await;
    let move_id = match inserted {
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            return Err(Error::Preflight {
                problem: format!("a move of {} is already open", plan.entity),
                fix: "`shard-directory list` shows it: resume or abort it".into(),
            })
        }
        other => other.map_err(at)?,
    };
    if let Some(id) = record::reversible_of(&tx, &plan.entity, reverses)
        .await
        .map_err(at)?
    {
        return Err(Error::Preflight {
            problem: format!("move {id} of {} has just become reversible", plan.entity),
            fix: format!(
                "`shard-directory finalize {id}` or `shard-directory revert {id}`, then move it"
            ),
        });
    }
    tx.execute(
        "SELECT pg_advisory_lock($1, $2)",
        &[&MOVE_LOCK_CLASS, &lock_key(move_id)],
    )
    .await
    .map_err(at)?;
    tx.execute(
        "SELECT shard_directory.begin_move($1, $2, $3)",
        &[
            &plan.entity.entity_type,
            &plan.entity.entity_id,
            &plan.target,
        ],
    )
    .await
    .map_err(at)?;
    point!("begin");
    tx.commit().await.map_err(at)?;
    Ok(move_id)
}

/// A move that could not be opened is as it was: a finished or unknown one needs nothing, any
/// other stays resumable.
pub(crate) fn not_opened(move_id: i64, error: Error) -> Failure {
    match &error {
        Error::UnknownMove(_) => Failure::untouched(error),
        Error::State { phase, .. } if phase.is_finished() => Failure {
            phase: Some(*phase),
            ..Failure::untouched(error)
        },
        _ => stopped(move_id, error, None),
    }
}

/// The second half of the move lock's key: ids wrap, which at worst makes two moves 2^32 apart
/// wait for each other.
fn lock_key(move_id: i64) -> i32 {
    move_id as i32
}
