//! Many moves from one plan ([`crate::planning::balance`]): the fleet a plan is made from (shards, entries,
//! sizes), and a plan run as a batch (a row of `shard_move_batches`, which its moves name), at
//! most `parallel` moves at once and `per_shard` per shard.
//!
//! The runner holds the batch's advisory lock and reads the batch's state before it starts each
//! move and every second meanwhile: `paused`, it starts no more and returns once the moves it
//! runs are done; `aborting`, it drops them, aborts every open move of the batch that has not cut
//! over (and finishes those that have), and marks the batch `aborted`. Each move reads the
//! directory first, so a batch resumed after its runner was killed picks up where it stopped: a
//! move already done is skipped, a move left open (to the same target) is resumed, and an entity
//! that is no longer where the plan found it is skipped and said so.
//!
//! A drain is a long job: the runner waits out its directory as a move does (for
//! `--directory-patience` from the first failure, connecting again and taking the batch's lock
//! again), its reads going on beside the moves it runs, which wait out the directory themselves.
//! Out of patience, or finding another runner holding the batch once the directory is back, it
//! starts no more moves, lets those under way end, and stops, the batch left as it was for
//! `batch resume`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use shard_directory_protocol::State;
use tokio_postgres::Client;

use crate::directory::entry;
use crate::directory::phase::Phase;
use crate::directory::record::{self, MoveRecord};
use crate::error::{At, Error, Failure, Place, Step};
use crate::failpoint::point;
use crate::mover::Mover;
use crate::options::MoveChoices;
use crate::patience::{Retry, Verdict, Wait};
use crate::planning::balance::{BatchPlan, Fleet, Placed, PlannedMove, ShardInfo};
use crate::planning::budget;
use crate::planning::sizes;
use crate::run::way_back;
use crate::shards::side::Side;
use crate::status;

/// How a plan's moves run.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Moves at once.
    pub parallel: usize,
    /// Moves at once that one shard takes part in (as source or target).
    pub per_shard: usize,
}

/// What became of one planned move.
#[derive(Debug)]
pub enum Outcome {
    Moved(Box<MoveRecord>),
    /// Not run, and why (already there, moved elsewhere, no entry).
    Skipped(String),
    Failed(Box<Failure>),
    /// Not started: the batch was paused or aborted first, or its runner stopped
    /// ([`BatchRun::stopped`]).
    NotStarted,
}

/// What a run of a batch did.
#[derive(Debug)]
pub struct BatchRun {
    /// Each planned move, and what became of it.
    pub moves: Vec<(PlannedMove, Outcome)>,
    /// Why the runner stopped before the batch's end, if it did: its directory did not answer
    /// within `--directory-patience` ([`Error::BatchStopped`]), another process took the batch
    /// while it reconnected ([`Error::BatchBusy`]), or ending the batch failed. The moves under
    /// way were let end first; the batch is left as it was, for `batch resume`.
    pub stopped: Option<Error>,
}

/// Class of the session advisory lock the runner of a batch holds (`pg_advisory_lock(int, int)`).
const BATCH_LOCK_CLASS: i32 = 0x5344_4254;

/// How often a runner reads its batch's state while moves run.
const STATE_POLL: Duration = Duration::from_secs(1);

/// A batch's state (`shard_move_batches.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchState {
    Running,
    Paused,
    Aborting,
    Aborted,
    Done,
}

impl BatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Running => "running",
            BatchState::Paused => "paused",
            BatchState::Aborting => "aborting",
            BatchState::Aborted => "aborted",
            BatchState::Done => "done",
        }
    }

    fn parse(s: &str) -> Option<BatchState> {
        [
            BatchState::Running,
            BatchState::Paused,
            BatchState::Aborting,
            BatchState::Aborted,
            BatchState::Done,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }
}

/// A row of `shard_move_batches`, and where each of its planned moves stands.
#[derive(Debug, Clone, Serialize)]
pub struct BatchStatus {
    pub batch_id: i64,
    pub purpose: String,
    pub state: BatchState,
    pub parallel: i32,
    pub per_shard: i32,
    /// How each of its moves is made, as the batch was started.
    pub move_options: MoveChoices,
    pub started_by: String,
    pub started_at: String,
    pub moves: Vec<BatchMove>,
}

/// A planned move of a batch: its last move record in the batch, if it began.
#[derive(Debug, Clone, Serialize)]
pub struct BatchMove {
    #[serde(flatten)]
    pub planned: PlannedMove,
    pub move_id: Option<i64>,
    /// The move's phase, or `pending` when it has not begun in this batch.
    pub phase: String,
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
    /// `planning/sizes.rs`), with its load when `load` (the shards' `entity_stats()`, which a shard
    /// of extension 0.1.0 lacks), and the freeze a move of it would take under this mover's
    /// options when that grows with its size (`planning/budget.rs`): what `drain`, `split` and
    /// `rebalance` plan from.
    pub async fn fleet(&self, load: bool) -> Result<Fleet, Error> {
        self.fleet_kept(load, true).await
    }

    /// [`Mover::fleet`] changing nothing: sizes measured now are not kept in the directory (the
    /// console's look, which a role without write access to `shard_sizes` may take).
    pub async fn fleet_as_seen(&self, load: bool) -> Result<Fleet, Error> {
        self.fleet_kept(load, false).await
    }

    async fn fleet_kept(&self, load: bool, keep: bool) -> Result<Fleet, Error> {
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
                freeze: None,
            });
        }
        let (mut entities, mut sizes_kept) = (Vec::new(), BTreeMap::new());
        for (shard, mut placed) in by_shard {
            let mut types: Vec<String> = placed.iter().map(|p| p.key.entity_type.clone()).collect();
            types.dedup();
            let side = self.connect_shard(&directory, &shard).await?;
            let keys: Vec<_> = placed.iter().map(|p| p.key.clone()).collect();
            let max_age = (self.options.sizes_max_age, keep);
            let of_shard = (keys.as_slice(), types.as_slice());
            let (sizes, age) =
                sizes::weighed(&directory, (&side.client, &shard), of_shard, load, max_age).await?;
            for p in &mut placed {
                p.size = sizes.get(&p.key).copied().unwrap_or_default();
            }
            if let Some(age) = age {
                sizes_kept.insert(shard.clone(), age);
            }
            for kind in &types {
                let tables = crate::shards::catalog::describe(&side.client, kind)
                    .await
                    .at(Step::Plan, shard.as_str())?;
                let of_kind = || placed.iter().filter(|p| &p.key.entity_type == kind);
                let largest = of_kind().max_by_key(|p| p.size.rows).map(|p| p.key.clone());
                let sides = (&side.client, shard.as_str());
                let per_row =
                    budget::per_row(&directory, sides, &tables, &self.options, largest.as_ref())
                        .await?;
                for p in placed.iter_mut().filter(|p| &p.key.entity_type == kind) {
                    p.freeze = per_row.map(|r| r.mul_f64(p.size.rows as f64));
                }
            }
            entities.extend(placed);
        }
        Ok(Fleet {
            shards,
            entities,
            max_freeze: self.options.max_freeze,
            sizes_kept,
            ways_back: way_back::open(&directory).await?,
        })
    }

    pub(crate) async fn connect_shard(
        &self,
        directory: &tokio_postgres::Client,
        shard: &str,
    ) -> Result<Side, Error> {
        let endpoint =
            crate::directory::registry::endpoint(directory, &self.overrides, shard).await?;
        Side::connect(endpoint, None).await
    }

    /// Records `plan` as a new batch, `running`, for [`Mover::resume_batch`] to run. A drain's
    /// is refused, and nothing recorded, while a way back joins the shard it drains (one may
    /// have begun since the plan was made).
    pub async fn record_batch(
        &self,
        plan: &BatchPlan,
        options: BatchOptions,
    ) -> Result<i64, Error> {
        let at_once = |n: usize, flag: &str| {
            i32::try_from(n.max(1))
                .map_err(|_| Error::Config(format!("{flag} {n}: at most {}", i32::MAX)))
        };
        let (parallel, per_shard) = (
            at_once(options.parallel, "--parallel")?,
            at_once(options.per_shard, "--per-shard")?,
        );
        let directory = self.connect_directory(None).await?;
        if let Some(shard) = &plan.drains {
            way_back::refuse_drain(shard, &way_back::open(&directory).await?)?;
        }
        let plan_json = serde_json::to_string(plan).expect("plain data serialises");
        let choices = serde_json::to_string(&MoveChoices::from(&self.options))
            .expect("plain data serialises");
        point!("batch.record");
        Ok(directory
            .query_one(
                "INSERT INTO shard_directory.shard_move_batches \
                     (purpose, plan, parallel, per_shard, move_options) \
                 VALUES ($1, $2::text::jsonb, $3, $4, $5::text::jsonb) RETURNING batch_id",
                &[&plan.purpose, &plan_json, &parallel, &per_shard, &choices],
            )
            .await
            .at(Step::Record, Place::Directory)?
            .get(0))
    }

    /// Runs batch `batch_id`: new, or from where it stopped (paused, or its runner killed or
    /// stopped). Its state goes back to `running`, and each of its moves is started, resumed or
    /// skipped as the directory says.
    pub async fn resume_batch(&self, batch_id: i64) -> Result<BatchRun, Error> {
        let mut session = Session::new(self, batch_id);
        // Locked first: a runner still finishing the moves of a pause is not set going again.
        session.lock().await?;
        let from = &["running", "paused"];
        let resumed = session
            .call(async |c| set_state(c, batch_id, BatchState::Running, from).await)
            .await?;
        if !resumed {
            let state = session
                .call(async |c| read_state(c, batch_id).await)
                .await?;
            return Err(Error::Preflight {
                problem: format!("batch {batch_id} is {}", state.as_str()),
                fix: "only a running or paused batch resumes; `batch status` shows its moves"
                    .into(),
            });
        }
        self.run_batch(session).await
    }

    /// Asks batch `batch_id`'s runner to start no more moves; the moves it runs go on to their
    /// end. Returns the batch as it stands.
    pub async fn pause_batch(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let mut session = Session::new(self, batch_id);
        session
            .call(async |c| set_state(c, batch_id, BatchState::Paused, &["running"]).await)
            .await?;
        session.call(async |c| read_status(c, batch_id).await).await
    }

    /// Aborts batch `batch_id`: its runner, if one runs it, drops its moves; every open move of
    /// the batch that has not cut over is aborted (one past it is finished), and the batch is
    /// `aborted`. Done moves stay done.
    pub async fn abort_batch(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let mut session = Session::new(self, batch_id);
        let from = &["running", "paused", "aborting"];
        session
            .call(async |c| set_state(c, batch_id, BatchState::Aborting, from).await)
            .await?;
        // A runner that holds the batch finishes the abort itself; otherwise this process does.
        match session.lock().await {
            Ok(()) => self.finish_abort(&mut session).await?,
            Err(Error::BatchBusy { .. }) => {
                for _ in 0..600 {
                    let state = session
                        .call(async |c| read_state(c, batch_id).await)
                        .await?;
                    if state == BatchState::Aborted {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => return Err(e),
        }
        session.call(async |c| read_status(c, batch_id).await).await
    }

    /// A batch and where each of its planned moves stands.
    pub async fn batch_status(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let directory = self.connect_directory(None).await?;
        read_status(&directory, batch_id).await
    }

    /// Every batch not finished, and every batch finished at or after `since` (any timestamptz
    /// input), newest first, on a directory session the caller holds (the console reads them
    /// with the moves, on its one session).
    pub async fn batches_open_or_finished_since(
        directory: &Client,
        since: &str,
    ) -> Result<Vec<BatchStatus>, Error> {
        let ids = directory
            .query(
                "SELECT batch_id FROM shard_directory.shard_move_batches \
                 WHERE finished_at IS NULL OR finished_at >= $1::text::timestamptz \
                 ORDER BY batch_id DESC",
                &[&since],
            )
            .await
            .at(Step::Record, Place::Directory)?;
        let mut batches = Vec::new();
        for row in ids {
            batches.push(read_status(directory, row.get(0)).await?);
        }
        Ok(batches)
    }

    /// Runs the batch of `session`, whose lock it holds, until its moves have ended, it is
    /// paused or aborted, or the runner stops.
    async fn run_batch(&self, mut session: Session<'_>) -> Result<BatchRun, Error> {
        let batch_id = session.batch_id;
        let status = session
            .call(async |c| read_status(c, batch_id).await)
            .await?;
        let options = BatchOptions {
            parallel: status.parallel.max(1) as usize,
            per_shard: status.per_shard.max(1) as usize,
        };
        let moves: Vec<PlannedMove> = status.moves.into_iter().map(|m| m.planned).collect();
        // Its moves are made as the batch began them, whatever this command was given.
        let mover = self.using(self.options.with(status.move_options));
        let mover = &mover;
        let open = session
            .call(async |c| {
                record::list(c, true, None)
                    .await
                    .at(Step::Record, Place::Directory)
            })
            .await?;
        let mut outcomes: Vec<Option<Outcome>> = moves.iter().map(|_| None).collect();
        let mut pending: Vec<(usize, Next)> = Vec::new();
        for (i, m) in moves.iter().enumerate() {
            let key = m.key();
            let entry = session
                .call(async |c| entry::read(c, &key).await.at(Step::Plan, Place::Directory))
                .await?;
            // A move of it left open (one past its cutover has its entry on the target already,
            // its source not yet cleared) is resumed, whatever the entry says.
            let left_open = open.iter().find(|r| {
                r.entity() == key
                    && r.target_shard == m.to
                    && r.source_shard == m.from
                    && r.phase != Phase::Reversible
            });
            let next = match (left_open, entry) {
                (Some(r), _) => Next::Resume(r.move_id),
                (None, None) => Next::Skip(format!("no directory entry for {key}")),
                (None, Some(e)) if e.state == State::Active && e.shard_name == m.to => {
                    Next::Skip(format!("{key} is on {} already", m.to))
                }
                (None, Some(e)) if e.state == State::Active && e.shard_name == m.from => {
                    Next::Start
                }
                (None, Some(e)) if e.state == State::Active => Next::Skip(format!(
                    "{key} is on {}, not on {} as planned",
                    e.shard_name, m.from
                )),
                (None, Some(e)) => Next::Skip(format!(
                    "{key} is {} toward {}: a move not in this plan is under way",
                    e.state,
                    e.target_shard.as_deref().unwrap_or("?")
                )),
            };
            match next {
                Next::Skip(why) => outcomes[i] = Some(Outcome::Skipped(why)),
                next => pending.push((i, next)),
            }
        }
        let mut busy: BTreeMap<&str, usize> = BTreeMap::new();
        let mut running = FuturesUnordered::new();
        // The session is lent to the read of the batch's state under way, which goes on while
        // the moves are driven (an outage may hold it up to the patience), and comes back with it.
        let mut session = Some(session);
        let mut reading = None;
        let (mut read_wanted, mut fresh) = (true, false);
        let mut state = BatchState::Running;
        let mut stopped: Option<Error> = None;
        let mut poll = tokio::time::interval(STATE_POLL);
        loop {
            if read_wanted && stopped.is_none() {
                if let Some(s) = session.take() {
                    reading = Some(Box::pin(s.poll()));
                    read_wanted = false;
                }
            }
            // Started only on a state just read: a pause or an abort may have come since.
            let may_start = std::mem::take(&mut fresh) && state == BatchState::Running;
            while may_start && running.len() < options.parallel {
                let free = |shard: &str| busy.get(shard).copied().unwrap_or(0) < options.per_shard;
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
                        Next::Resume(id) => mover.resume(id).await,
                        _ => mover.start_in(&m.key(), &m.to, Some(batch_id)).await,
                    };
                    (i, result)
                });
            }
            let startable =
                stopped.is_none() && state == BatchState::Running && !pending.is_empty();
            if running.is_empty() && reading.is_none() && !startable {
                break;
            }
            tokio::select! {
                Some((i, result)) = running.next() => {
                    let m = &moves[i];
                    for shard in [m.from.as_str(), m.to.as_str()] {
                        *busy.get_mut(shard).expect("counted") -= 1;
                    }
                    outcomes[i] = Some(match result {
                        Ok(record) => Outcome::Moved(Box::new(record)),
                        Err(failure) => Outcome::Failed(Box::new(failure)),
                    });
                    read_wanted = true;
                }
                (s, read) = async { reading.as_mut().expect("a read under way").await },
                    if reading.is_some() =>
                {
                    (reading, session) = (None, Some(s));
                    match read {
                        Ok(now) => (state, fresh) = (now, true),
                        Err(e) => {
                            tracing::warn!(
                                "batch {batch_id}: starting no more moves; waiting for the {} under \
                                 way to stop: {e}",
                                running.len()
                            );
                            stopped = Some(e);
                        }
                    }
                    if state == BatchState::Aborting {
                        break;
                    }
                }
                _ = poll.tick() => read_wanted = true,
            }
        }
        // Only an abort leaves moves here: dropped, and undone (or finished) by `finish_abort`.
        drop(running);
        let mut session = session.expect("no read under way");
        let failed = outcomes
            .iter()
            .any(|o| matches!(o, Some(Outcome::Failed(_))));
        if stopped.is_none() {
            let ended = async {
                match session
                    .call(async |c| read_state(c, batch_id).await)
                    .await?
                {
                    BatchState::Aborting => self.finish_abort(&mut session).await?,
                    // A failed move leaves the batch running: `batch resume` tries it again.
                    BatchState::Running if pending.is_empty() && !failed => {
                        session
                            .call(async |c| {
                                set_state(c, batch_id, BatchState::Done, &["running"]).await
                            })
                            .await?;
                    }
                    _ => {}
                }
                Ok::<_, Error>(())
            };
            stopped = ended.await.err();
        }
        let outcomes = outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::NotStarted));
        Ok(BatchRun {
            moves: moves.into_iter().zip(outcomes).collect(),
            stopped,
        })
    }

    /// Under the batch's lock: every open move of the batch aborted (or, past its cutover,
    /// finished), then the batch `aborted`.
    async fn finish_abort(&self, session: &mut Session<'_>) -> Result<(), Error> {
        let batch_id = session.batch_id;
        let open = session
            .call(async |c| {
                c.query(
                    "SELECT move_id, phase FROM shard_directory.shard_moves \
                     WHERE batch_id = $1 AND finished_at IS NULL ORDER BY move_id",
                    &[&batch_id],
                )
                .await
                .at(Step::Record, Place::Directory)
            })
            .await?;
        for row in &open {
            let (move_id, phase): (i64, &str) = (row.get(0), row.get(1));
            if Phase::parse(phase).is_some_and(|p| !p.can_abort()) {
                // Waits out the directory itself.
                self.resume(move_id).await.map_err(|f| f.error)?;
            } else {
                session
                    .call(async |_| self.abort(move_id).await.map_err(|f| f.error))
                    .await?;
            }
        }
        session
            .call(async |c| set_state(c, batch_id, BatchState::Aborted, &["aborting"]).await)
            .await?;
        Ok(())
    }
}

/// A batch's session on the directory. A call that finds the directory gone
/// ([`Error::lost_directory`]) is made again, on a new session once this one is found dead, for
/// up to `--directory-patience` from the first failure, as a move waits out its directory; a new
/// session takes the batch's lock again if this one held it.
struct Session<'m> {
    mover: &'m Mover,
    batch_id: i64,
    client: Option<Client>,
    /// Whether the batch's lock is held: taken again on each new session.
    locked: bool,
    /// The last call found the directory gone: the session is checked before it is used again.
    suspect: bool,
}

impl<'m> Session<'m> {
    fn new(mover: &'m Mover, batch_id: i64) -> Session<'m> {
        Session {
            mover,
            batch_id,
            client: None,
            locked: false,
            suspect: false,
        }
    }

    /// `call` on the session, waiting out the directory; out of patience, `BatchStopped`.
    async fn call<T>(
        &mut self,
        call: impl AsyncFn(&Client) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let (batch_id, patience) = (self.batch_id, self.mover.options.directory_patience);
        let mut retry = Retry::new(Wait {
            patience,
            from_call: false,
            whole_pauses: false,
        });
        let mut warned = false;
        let called = loop {
            let error = match self.attempt(&call).await {
                Err(e) => e,
                done => break done,
            };
            if !error.lost_directory() {
                break Err(error);
            }
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!(
                    "batch {batch_id}: the directory stopped answering ({error}); trying again \
                     for up to {}",
                    humantime::format_duration(patience)
                )
            }
            if !retry.again(Verdict::Again).await {
                break Err(error);
            }
        };
        called.map_err(|e| match e.lost_directory() {
            true => Error::BatchStopped {
                batch_id,
                patience,
                cause: Box::new(e),
            },
            false => e,
        })
    }

    async fn attempt<T>(
        &mut self,
        call: &impl AsyncFn(&Client) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if std::mem::take(&mut self.suspect) {
            if let Some(c) = &self.client {
                if c.is_closed() || c.simple_query("SELECT 1").await.is_err() {
                    // Dropped before a new session asks for the lock it may still hold.
                    self.client = None;
                }
            }
        }
        let client = match self.client.take() {
            Some(c) => c,
            None => {
                let c = self.mover.connect_directory(None).await?;
                if self.locked {
                    lock(&c, self.batch_id).await?;
                }
                c
            }
        };
        let result = call(self.client.insert(client)).await;
        self.suspect = matches!(&result, Err(e) if e.lost_directory());
        result
    }

    /// Takes the batch's lock, held from then on (on each new session too); `BatchBusy` when
    /// another process holds it.
    async fn lock(&mut self) -> Result<(), Error> {
        let batch_id = self.batch_id;
        self.call(async |c| lock(c, batch_id).await).await?;
        self.locked = true;
        Ok(())
    }

    /// The batch's state, read by the runner's poll; the session handed back with it, so that
    /// the read can go on beside the moves.
    async fn poll(mut self) -> (Session<'m>, Result<BatchState, Error>) {
        let batch_id = self.batch_id;
        let read = async {
            point!("batch.poll");
            self.call(async |c| read_state(c, batch_id).await).await
        };
        let read = read.await;
        (self, read)
    }
}

/// Takes batch `batch_id`'s lock on `directory`'s session, or names who holds it
/// (`BatchBusy`). A runner that was just killed may hold it until the server notices its session
/// is gone: tried for 5 s.
async fn lock(directory: &Client, batch_id: i64) -> Result<(), Error> {
    point!("batch.lock");
    for _ in 0..50 {
        let locked: bool = directory
            .query_one(
                "SELECT pg_try_advisory_lock($1, $2)",
                &[&BATCH_LOCK_CLASS, &(batch_id as i32)],
            )
            .await
            .at(Step::Record, Place::Directory)?
            .get(0);
        if locked {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holder = status::driver(directory, BATCH_LOCK_CLASS, batch_id as i32)
        .await
        .at(Step::Record, Place::Directory)?;
    Err(Error::BatchBusy {
        batch_id,
        holder: holder.map_or_else(|| "a session that has just ended".into(), |d| d.to_string()),
    })
}

/// A batch and where each of its planned moves stands.
async fn read_status(directory: &Client, batch_id: i64) -> Result<BatchStatus, Error> {
    let row = directory
        .query_opt(
            "SELECT purpose, plan::text, state, parallel, per_shard, started_by, started_at::text, \
                    move_options::text \
             FROM shard_directory.shard_move_batches WHERE batch_id = $1",
            &[&batch_id],
        )
        .await
        .at(Step::Record, Place::Directory)?
        .ok_or(Error::UnknownBatch(batch_id))?;
    let plan: BatchPlan = serde_json::from_str(row.get(1))
        .map_err(|e| Error::Config(format!("batch {batch_id}'s plan does not read back: {e}")))?;
    let move_options: MoveChoices = serde_json::from_str(row.get(7)).map_err(|e| {
        Error::Config(format!(
            "batch {batch_id}'s move_options do not read back: {e}"
        ))
    })?;
    let records = directory
        .query(
            "SELECT DISTINCT ON (entity_type, entity_id) entity_type, entity_id, move_id, phase \
             FROM shard_directory.shard_moves WHERE batch_id = $1 \
             ORDER BY entity_type, entity_id, move_id DESC",
            &[&batch_id],
        )
        .await
        .at(Step::Record, Place::Directory)?;
    let moves = plan
        .moves
        .into_iter()
        .map(|planned| {
            let record = records.iter().find(|r| {
                r.get::<_, &str>(0) == planned.entity_type
                    && r.get::<_, &str>(1) == planned.entity_id
            });
            BatchMove {
                move_id: record.map(|r| r.get(2)),
                phase: record.map_or_else(|| "pending".to_owned(), |r| r.get(3)),
                planned,
            }
        })
        .collect();
    Ok(BatchStatus {
        batch_id,
        purpose: row.get(0),
        state: BatchState::parse(row.get(2)).unwrap_or(BatchState::Running),
        parallel: row.get(3),
        per_shard: row.get(4),
        move_options,
        started_by: row.get(5),
        started_at: row.get(6),
        moves,
    })
}

async fn read_state(directory: &Client, batch_id: i64) -> Result<BatchState, Error> {
    let row = directory
        .query_opt(
            "SELECT state FROM shard_directory.shard_move_batches WHERE batch_id = $1",
            &[&batch_id],
        )
        .await
        .at(Step::Record, Place::Directory)?
        .ok_or(Error::UnknownBatch(batch_id))?;
    Ok(BatchState::parse(row.get(0)).unwrap_or(BatchState::Running))
}

/// Sets the batch's state when it is one of `from`; whether it was.
async fn set_state(
    directory: &Client,
    batch_id: i64,
    to: BatchState,
    from: &[&str],
) -> Result<bool, Error> {
    let finished = matches!(to, BatchState::Aborted | BatchState::Done);
    point!("batch.state.{}", to.as_str());
    let n = directory
        .execute(
            "UPDATE shard_directory.shard_move_batches SET state = $2, updated_at = now(), \
                    finished_at = CASE WHEN $3 THEN now() END \
             WHERE batch_id = $1 AND state = ANY ($4)",
            &[&batch_id, &to.as_str(), &finished, &from],
        )
        .await
        .at(Step::Record, Place::Directory)?;
    if n == 0 {
        read_state(directory, batch_id).await?;
    }
    Ok(n == 1)
}
