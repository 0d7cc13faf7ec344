//! The `Mover`: starts, resumes and aborts moves. Each step reads the real state (the directory
//! entry, the fences, the replication catalogs) and is safe to run twice, so a move that stopped
//! anywhere, crashed or killed, continues with `resume` or returns to its start with `abort`.
//!
//! Order of a move (DESIGN.md, "Moves"): `begin_move` -> copy (and stream) -> lag small -> fence
//! `frozen` on the source and `freeze` the entry -> source WAL position taken after the fence
//! commits -> target confirmed past it -> verify -> sequences -> target fenced `owned` ->
//! `complete_move` (the point of no return) -> source fenced `moved` -> replication objects
//! dropped -> source rows deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shard_directory_client::EntityKey;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use crate::catalog;
use crate::entry::{self, HistoryRow, Placement};
use crate::error::{At, Error, Failure, Place, Step};
use crate::logical;
use crate::observer::{LogObserver, Observer};
use crate::phase::Phase;
use crate::preflight::{preflight, Plan};
use crate::record::{self, MoveRecord, NewMove, TableProgress};
use crate::registry::{self, Overrides};
use crate::run::{stopped, Run};
use crate::side::{self, Side};

/// Which method to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MethodChoice {
    /// `logical` when the source has `wal_level = logical`, else `copy`.
    #[default]
    Auto,
    Logical,
    Copy,
}

#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub method: MethodChoice,
    /// Longest time the entity's writes may be refused; past it the move aborts itself.
    pub max_freeze: Duration,
    /// Leave the entity's rows on the source (fenced `moved`, so nobody reads or writes them).
    pub keep_source: bool,
    /// Longest time the initial copy, and the catch-up before the freeze, may take. Past it the
    /// move stops, resumable; the entity stays writable throughout.
    pub sync_timeout: Duration,
    /// Rows deleted per transaction when clearing a shard of the entity's rows.
    pub delete_batch: i64,
    /// Tables (`schema.table`) with a column named like the entity's key column that does not
    /// hold entity ids: preflight otherwise refuses a table it cannot tell from an unprotected
    /// table of the entity.
    pub unrelated_tables: Vec<String>,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            method: MethodChoice::Auto,
            max_freeze: Duration::from_secs(10),
            keep_source: false,
            sync_timeout: Duration::from_secs(30 * 60),
            delete_batch: 10_000,
            unrelated_tables: Vec::new(),
        }
    }
}

/// Class of the session advisory lock a run holds on its move (`pg_advisory_lock(int, int)`).
const MOVE_LOCK_CLASS: i32 = 0x5344_4d56;

/// Starts, resumes, aborts and inspects moves. Holds no connection: each call opens its own, so
/// one `Mover` may run several moves at once.
pub struct Mover {
    directory: Config,
    overrides: Overrides,
    pub(crate) options: MoveOptions,
    pub(crate) observer: Arc<dyn Observer>,
}

impl Mover {
    /// A mover over the directory database at `directory`. `options` apply to the moves it
    /// starts (a resumed move keeps its own method, `max_freeze` and `keep_source`).
    pub fn new(directory: Config, overrides: Overrides, options: MoveOptions) -> Mover {
        Mover {
            directory: registry::with_password(directory),
            overrides,
            options,
            observer: Arc::new(LogObserver),
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Mover {
        self.observer = observer;
        self
    }

    async fn connect_directory(&self, move_id: Option<i64>) -> Result<Client, Error> {
        registry::connect(&self.directory, &side::application_name(move_id))
            .await
            .at(Step::Connect, Place::Directory)
    }

    /// Checks that `key` can move to `target` and says how, changing nothing.
    pub async fn plan(&self, key: &EntityKey, target: &str) -> Result<Plan, Error> {
        let directory = self.connect_directory(None).await?;
        Ok(
            preflight(&directory, &self.overrides, &self.options, key, target)
                .await?
                .0,
        )
    }

    /// Starts a move of `key` to `target` and runs it to the end.
    pub async fn start(&self, key: &EntityKey, target: &str) -> Result<MoveRecord, Failure> {
        let mut directory = self
            .connect_directory(None)
            .await
            .map_err(Failure::untouched)?;
        let (plan, tables, source, target) =
            preflight(&directory, &self.overrides, &self.options, key, target)
                .await
                .map_err(Failure::untouched)?;
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
        let move_id = begin(&mut directory, &plan, &self.options, &progress)
            .await
            .map_err(Failure::untouched)?;
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)
            .map_err(|e| stopped(move_id, e))?
            .expect("just inserted");
        for side in [&source, &target] {
            side.name_after(move_id)
                .await
                .map_err(|e| stopped(move_id, e))?;
        }
        self.observer.phase(move_id, record.phase).await;
        Run::new(self, directory, record, source, target, tables)
            .drive()
            .await
    }

    /// Continues move `move_id` from where its record and the real state say it is.
    pub async fn resume(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let run = self.open(move_id).await.map_err(|e| stopped(move_id, e))?;
        if run.record.phase == Phase::Aborted {
            return Err(stopped(
                move_id,
                Error::State {
                    move_id,
                    phase: run.record.phase,
                    why: "the move was aborted; start a new one".into(),
                },
            ));
        }
        run.drive().await
    }

    /// Returns move `move_id` to its start (entry active on the source, fences as they were, the
    /// entity's rows on the target deleted, replication objects dropped). Refused once the move
    /// has passed `complete_move`: from there only forward.
    pub async fn abort(&self, move_id: i64) -> Result<MoveRecord, Failure> {
        let mut run = self.open(move_id).await.map_err(|e| stopped(move_id, e))?;
        match run.record.phase {
            Phase::Aborted => Ok(run.record),
            p if p.can_abort() => match run.abort().await {
                Ok(()) => Ok(run.record),
                Err(e) => Err(stopped(move_id, e)),
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
        if record.phase == Phase::Done {
            return Err(Error::State {
                move_id,
                phase: record.phase,
                why: "the move is done".into(),
            });
        }
        // A run that just crashed may hold the lock until the server notices its session is gone.
        let mut locked = false;
        for _ in 0..50 {
            locked = directory
                .query_one(
                    "SELECT pg_try_advisory_lock($1, $2)",
                    &[&MOVE_LOCK_CLASS, &lock_key(move_id)],
                )
                .await
                .at(Step::Record, Place::Directory)?
                .get(0);
            if locked {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !locked {
            return Err(Error::Busy(move_id));
        }
        // Read again under the lock: the run that held it may have moved the phase on.
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .expect("a move record is never deleted");
        let mut sides = Vec::new();
        for shard in [&record.source_shard, &record.target_shard] {
            let endpoint = registry::endpoint(&directory, &self.overrides, shard).await?;
            sides.push(Side::connect(endpoint, Some(move_id)).await?);
        }
        let target = sides.pop().expect("two sides");
        let source = sides.pop().expect("two sides");
        let tables = catalog::describe(&source.client, &record.entity_type)
            .await
            .at(Step::Preflight, source.name())?;
        Ok(Run::new(self, directory, record, source, target, tables))
    }

    /// Runs one read on a new directory connection.
    async fn read<T>(
        &self,
        query: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, Error> {
        let directory = self.connect_directory(None).await?;
        query(&directory).await.at(Step::Record, Place::Directory)
    }

    pub async fn status(&self, move_id: i64) -> Result<MoveRecord, Error> {
        self.read(async |c| record::load(c, move_id).await)
            .await?
            .ok_or(Error::UnknownMove(move_id))
    }

    /// Every move, newest first (only the open ones with `open_only`).
    pub async fn list(&self, open_only: bool) -> Result<Vec<MoveRecord>, Error> {
        self.read(async |c| record::list(c, open_only).await).await
    }

    /// The entity's entry now.
    pub async fn placement(&self, key: &EntityKey) -> Result<Option<Placement>, Error> {
        self.read(async |c| entry::read(c, key).await).await
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
    /// are finished, aborted, or unknown to the directory. Returns what it dropped; shards it
    /// cannot reach are skipped with a note.
    pub async fn cleanup(&self) -> Result<Vec<String>, Error> {
        let directory = self.connect_directory(None).await?;
        let names = async |sql: &str| -> Result<Vec<String>, Error> {
            let rows = directory.query(sql, &[]).await;
            Ok(rows
                .at(Step::Cleanup, Place::Directory)?
                .iter()
                .map(|r| r.get(0))
                .collect())
        };
        let open: BTreeSet<String> = names(
            "SELECT replication_name FROM shard_directory.shard_moves WHERE finished_at IS NULL",
        )
        .await?
        .into_iter()
        .collect();
        let shards =
            names("SELECT shard_name FROM shard_directory.shards ORDER BY shard_name").await?;
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
                    if kind != pass || open.contains(&name) {
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
        Ok(dropped)
    }
}

/// The record, `begin_move` and the run's lock on the move, in one directory transaction.
async fn begin(
    directory: &mut Client,
    plan: &Plan,
    options: &MoveOptions,
    tables: &BTreeMap<String, TableProgress>,
) -> Result<i64, Error> {
    let at = |e| Error::Db {
        step: Step::Begin,
        place: Place::Directory,
        source: e,
    };
    let tx = directory.transaction().await.map_err(at)?;
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
    tx.commit().await.map_err(at)?;
    Ok(move_id)
}

/// The second half of the move lock's key: ids wrap, which at worst makes two moves 2^32 apart
/// wait for each other.
fn lock_key(move_id: i64) -> i32 {
    move_id as i32
}
