//! Many moves from one plan ([`crate::balance`]): the fleet a plan is made from (shards, entries,
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

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use shard_directory_protocol::State;
use tokio_postgres::Client;

use crate::balance::{BatchPlan, Fleet, Placed, PlannedMove, ShardInfo};
use crate::budget;
use crate::entry;
use crate::error::{At, Error, Failure, Place, Step};
use crate::mover::Mover;
use crate::options::MoveChoices;
use crate::phase::Phase;
use crate::record::MoveRecord;
use crate::side::Side;
use crate::sizes;
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
    /// Not started: the batch was paused or aborted first.
    NotStarted,
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
    /// `sizes.rs`), with its load when `load` (the shards' `entity_stats()`, which a shard
    /// of extension 0.1.0 lacks), and the freeze a move of it would take under this mover's
    /// options when that grows with its size (`budget.rs`): what `drain`, `split` and
    /// `rebalance` plan from.
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
                freeze: None,
            });
        }
        let (mut entities, mut sizes_kept) = (Vec::new(), BTreeMap::new());
        for (shard, mut placed) in by_shard {
            let mut types: Vec<String> = placed.iter().map(|p| p.key.entity_type.clone()).collect();
            types.dedup();
            let side = self.connect_shard(&directory, &shard).await?;
            let keys: Vec<_> = placed.iter().map(|p| p.key.clone()).collect();
            let max_age = self.options.sizes_max_age;
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
                let tables = crate::catalog::describe(&side.client, kind)
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
        })
    }

    pub(crate) async fn connect_shard(
        &self,
        directory: &tokio_postgres::Client,
        shard: &str,
    ) -> Result<Side, Error> {
        let endpoint = crate::registry::endpoint(directory, &self.overrides, shard).await?;
        Side::connect(endpoint, None).await
    }

    /// Records `plan` as a new batch, `running`, for [`Mover::resume_batch`] to run.
    pub async fn record_batch(
        &self,
        plan: &BatchPlan,
        options: BatchOptions,
    ) -> Result<i64, Error> {
        let directory = self.connect_directory(None).await?;
        let plan_json = serde_json::to_string(plan).expect("plain data serialises");
        let choices = serde_json::to_string(&MoveChoices::from(&self.options))
            .expect("plain data serialises");
        Ok(directory
            .query_one(
                "INSERT INTO shard_directory.shard_move_batches \
                     (purpose, plan, parallel, per_shard, move_options) \
                 VALUES ($1, $2::text::jsonb, $3, $4, $5::text::jsonb) RETURNING batch_id",
                &[
                    &plan.purpose,
                    &plan_json,
                    &(options.parallel.max(1) as i32),
                    &(options.per_shard.max(1) as i32),
                    &choices,
                ],
            )
            .await
            .at(Step::Record, Place::Directory)?
            .get(0))
    }

    /// Runs batch `batch_id`: new, or from where it stopped (paused, or its runner killed). Its
    /// state goes back to `running`, and each of its moves is started, resumed or skipped as the
    /// directory says.
    pub async fn resume_batch(&self, batch_id: i64) -> Result<Vec<(PlannedMove, Outcome)>, Error> {
        let directory = self.connect_directory(None).await?;
        let moved = set_state(
            &directory,
            batch_id,
            BatchState::Running,
            &["running", "paused"],
        )
        .await?;
        if !moved {
            let state = self.batch_status(batch_id).await?.state;
            return Err(Error::Preflight {
                problem: format!("batch {batch_id} is {}", state.as_str()),
                fix: "only a running or paused batch resumes; `batch status` shows its moves"
                    .into(),
            });
        }
        self.run_batch(directory, batch_id).await
    }

    /// Asks batch `batch_id`'s runner to start no more moves; the moves it runs go on to their
    /// end. Returns the batch as it stands.
    pub async fn pause_batch(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let directory = self.connect_directory(None).await?;
        set_state(&directory, batch_id, BatchState::Paused, &["running"]).await?;
        self.batch_status(batch_id).await
    }

    /// Aborts batch `batch_id`: its runner, if one runs it, drops its moves; every open move of
    /// the batch that has not cut over is aborted (one past it is finished), and the batch is
    /// `aborted`. Done moves stay done.
    pub async fn abort_batch(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let directory = self.connect_directory(None).await?;
        set_state(
            &directory,
            batch_id,
            BatchState::Aborting,
            &["running", "paused", "aborting"],
        )
        .await?;
        // A runner that holds the batch finishes the abort itself; otherwise this process does.
        if try_lock(&directory, batch_id).await? {
            self.finish_abort(&directory, batch_id).await?;
        } else {
            for _ in 0..600 {
                if self.batch_status(batch_id).await?.state == BatchState::Aborted {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.batch_status(batch_id).await
    }

    /// A batch and where each of its planned moves stands.
    pub async fn batch_status(&self, batch_id: i64) -> Result<BatchStatus, Error> {
        let directory = self.connect_directory(None).await?;
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
        let plan: BatchPlan = serde_json::from_str(row.get(1)).map_err(|e| {
            Error::Config(format!("batch {batch_id}'s plan does not read back: {e}"))
        })?;
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

    /// Runs batch `batch_id` under its lock, held on `directory` until this returns.
    async fn run_batch(
        &self,
        directory: Client,
        batch_id: i64,
    ) -> Result<Vec<(PlannedMove, Outcome)>, Error> {
        if !try_lock(&directory, batch_id).await? {
            let holder = status::driver(&directory, BATCH_LOCK_CLASS, batch_id as i32)
                .await
                .at(Step::Record, Place::Directory)?;
            return Err(Error::BatchBusy {
                batch_id,
                holder: holder
                    .map_or_else(|| "a session that has just ended".into(), |d| d.to_string()),
            });
        }
        let status = self.batch_status(batch_id).await?;
        let options = BatchOptions {
            parallel: status.parallel.max(1) as usize,
            per_shard: status.per_shard.max(1) as usize,
        };
        let moves: Vec<PlannedMove> = status.moves.into_iter().map(|m| m.planned).collect();
        // Its moves are made as the batch began them, whatever this command was given.
        let mover = self.using(self.options.with(status.move_options));
        let mover = &mover;
        let open = self.list(true, None).await?;
        let mut outcomes: Vec<Option<Outcome>> = moves.iter().map(|_| None).collect();
        let mut pending: Vec<(usize, Next)> = Vec::new();
        for (i, m) in moves.iter().enumerate() {
            let key = m.key();
            let entry = entry::read(&directory, &key)
                .await
                .at(Step::Plan, Place::Directory)?;
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
        let mut state = BatchState::Running;
        let mut poll = tokio::time::interval(STATE_POLL);
        loop {
            // Read before starting any: a pause or an abort may have come since the last look.
            if !pending.is_empty() && running.len() < options.parallel {
                state = read_state(&directory, batch_id).await?;
            }
            if state == BatchState::Aborting {
                break;
            }
            while state == BatchState::Running && running.len() < options.parallel {
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
            if running.is_empty() {
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
                }
                _ = poll.tick() => {
                    state = read_state(&directory, batch_id).await?;
                    if state == BatchState::Aborting {
                        break;
                    }
                }
            }
        }
        drop(running);
        match read_state(&directory, batch_id).await? {
            BatchState::Aborting => self.finish_abort(&directory, batch_id).await?,
            // A failed move leaves the batch running: `batch resume` tries it again.
            BatchState::Running
                if pending.is_empty()
                    && !outcomes
                        .iter()
                        .any(|o| matches!(o, Some(Outcome::Failed(_)))) =>
            {
                set_state(&directory, batch_id, BatchState::Done, &["running"]).await?;
            }
            _ => {}
        }
        Ok(moves
            .iter()
            .cloned()
            .zip(
                outcomes
                    .into_iter()
                    .map(|o| o.unwrap_or(Outcome::NotStarted)),
            )
            .collect())
    }

    /// Under the batch's lock: every open move of the batch aborted (or, past its cutover,
    /// finished), then the batch `aborted`.
    async fn finish_abort(&self, directory: &Client, batch_id: i64) -> Result<(), Error> {
        let open = directory
            .query(
                "SELECT move_id, phase FROM shard_directory.shard_moves \
                 WHERE batch_id = $1 AND finished_at IS NULL ORDER BY move_id",
                &[&batch_id],
            )
            .await
            .at(Step::Record, Place::Directory)?;
        for row in &open {
            let (move_id, phase): (i64, &str) = (row.get(0), row.get(1));
            let forward = Phase::parse(phase).is_some_and(|p| !p.can_abort());
            let done = if forward {
                self.resume(move_id).await
            } else {
                self.abort(move_id).await
            };
            if let Err(failure) = done {
                return Err(failure.error);
            }
        }
        set_state(directory, batch_id, BatchState::Aborted, &["aborting"]).await?;
        Ok(())
    }
}

/// Takes batch `batch_id`'s lock on `directory`'s session if no one holds it (waiting up to 5 s
/// for a runner that was just killed to be noticed gone).
async fn try_lock(directory: &Client, batch_id: i64) -> Result<bool, Error> {
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
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
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
