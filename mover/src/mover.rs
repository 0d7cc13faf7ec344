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
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shard_directory_client::{EntityKey, State};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use crate::catalog::{self, EntityTable};
use crate::copy;
use crate::entry::{self, HistoryRow, Placement};
use crate::error::{At, Error, Failure, Left, Place, Step};
use crate::fence::{self, Fence};
use crate::logical;
use crate::observer::{LogObserver, Observer};
use crate::phase::Phase;
use crate::purge;
use crate::record::{self, Method, MoveRecord, NewMove, TableProgress};
use crate::registry::{self, Overrides};
use crate::sequences;
use crate::side::{self, Side};
use crate::verify;

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
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            method: MethodChoice::Auto,
            max_freeze: Duration::from_secs(10),
            keep_source: false,
            sync_timeout: Duration::from_secs(30 * 60),
            delete_batch: 10_000,
        }
    }
}

/// What a move would do, as preflight found it (`--dry-run`).
#[derive(Debug, Clone)]
pub struct Plan {
    pub entity: EntityKey,
    pub source: String,
    pub target: String,
    pub method: Method,
    /// Each table of the entity (parents first) and its rows of the entity on the source.
    pub tables: Vec<(String, i64)>,
    pub source_fence: Fence,
    pub target_fence: Fence,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "move {} from {} to {} by {} copy",
            self.entity,
            self.source,
            self.target,
            self.method.as_str()
        )?;
        for (table, rows) in &self.tables {
            writeln!(f, "  {table}: {rows} rows")?;
        }
        writeln!(
            f,
            "  fences now: source {}, target {}",
            self.source_fence, self.target_fence
        )?;
        let steps = match self.method {
            Method::Logical => {
                "begin_move; publication + subscription (copy, then stream); wait for a small lag; \
                 freeze; catch up; verify; sequences; fence target; complete_move; fence source; \
                 drop replication; delete source rows"
            }
            Method::Copy => {
                "begin_move; freeze; copy; verify; sequences; fence target; complete_move; \
                 fence source; delete source rows"
            }
        };
        write!(f, "  steps: {steps}")
    }
}

/// Class of the session advisory lock a run holds on its move (`pg_advisory_lock(int, int)`).
const MOVE_LOCK_CLASS: i32 = 0x5344_4d56;

/// Starts, resumes, aborts and inspects moves. Holds no connection: each call opens its own, so
/// one `Mover` may run several moves at once.
pub struct Mover {
    directory: Config,
    overrides: Overrides,
    options: MoveOptions,
    observer: Arc<dyn Observer>,
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
        Ok(self.preflight(&directory, key, target).await?.0)
    }

    /// Starts a move of `key` to `target` and runs it to the end.
    pub async fn start(&self, key: &EntityKey, target: &str) -> Result<MoveRecord, Failure> {
        let mut directory = self
            .connect_directory(None)
            .await
            .map_err(Failure::untouched)?;
        let (plan, tables, source, target) = self
            .preflight(&directory, key, target)
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
        let _ = directory
            .execute(
                "SELECT set_config('application_name', $1, false)",
                &[&side::application_name(Some(move_id))],
            )
            .await;
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
        let record = record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))?;
        if !locked {
            return Err(Error::Busy(move_id));
        }
        if record.phase == Phase::Done {
            return Err(Error::State {
                move_id,
                phase: record.phase,
                why: "the move is done".into(),
            });
        }
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

    pub async fn status(&self, move_id: i64) -> Result<MoveRecord, Error> {
        let directory = self.connect_directory(None).await?;
        record::load(&directory, move_id)
            .await
            .at(Step::Record, Place::Directory)?
            .ok_or(Error::UnknownMove(move_id))
    }

    /// Every move, newest first (only the open ones with `open_only`).
    pub async fn list(&self, open_only: bool) -> Result<Vec<MoveRecord>, Error> {
        let directory = self.connect_directory(None).await?;
        record::list(&directory, open_only)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// The entity's entry now.
    pub async fn placement(&self, key: &EntityKey) -> Result<Option<Placement>, Error> {
        let directory = self.connect_directory(None).await?;
        entry::read(&directory, key)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// The shard that held the entity at `at` (any timestamptz input), from history.
    pub async fn placement_at(&self, key: &EntityKey, at: &str) -> Result<Option<String>, Error> {
        let directory = self.connect_directory(None).await?;
        entry::placement_at(&directory, key, at)
            .await
            .at(Step::Record, Place::Directory)
    }

    pub async fn history(&self, key: &EntityKey) -> Result<Vec<HistoryRow>, Error> {
        let directory = self.connect_directory(None).await?;
        entry::history(&directory, key)
            .await
            .at(Step::Record, Place::Directory)
    }

    /// Drops replication objects (`sd_move_<id>`) left on any registered shard by moves that
    /// are finished, aborted, or unknown to the directory. Returns what it dropped; shards it
    /// cannot reach are skipped with a note.
    pub async fn cleanup(&self) -> Result<Vec<String>, Error> {
        let directory = self.connect_directory(None).await?;
        let open: BTreeSet<String> = directory
            .query(
                "SELECT replication_name FROM shard_directory.shard_moves WHERE finished_at IS NULL",
                &[],
            )
            .await
            .at(Step::Cleanup, Place::Directory)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let shards: Vec<String> = directory
            .query(
                "SELECT shard_name FROM shard_directory.shards ORDER BY shard_name",
                &[],
            )
            .await
            .at(Step::Cleanup, Place::Directory)?
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

    /// What `start` checks before it changes anything. Returns the plan, the entity's tables
    /// (parents first) and connections to both shards.
    async fn preflight(
        &self,
        directory: &Client,
        key: &EntityKey,
        target_name: &str,
    ) -> Result<(Plan, Vec<EntityTable>, Side, Side), Error> {
        let refuse = |problem: String, fix: String| Err(Error::Preflight { problem, fix });
        let Some(entry) = entry::read(directory, key)
            .await
            .at(Step::Preflight, Place::Directory)?
        else {
            return refuse(
                format!("no directory entry for {key}"),
                "insert it into shard_directory.shard_directory first".into(),
            );
        };
        if entry.state != State::Active {
            return refuse(
                format!(
                    "{key} is {} on {} (target {}): a move is already under way",
                    entry.state,
                    entry.shard_name,
                    entry.target_shard.as_deref().unwrap_or("none")
                ),
                "`shard-directory list` shows open moves: resume or abort that one".into(),
            );
        }
        if entry.shard_name == target_name {
            return refuse(
                format!("{key} is already on {target_name}"),
                "choose another target shard".into(),
            );
        }
        let source = Side::connect(
            registry::endpoint(directory, &self.overrides, &entry.shard_name).await?,
            None,
        )
        .await?;
        let target = Side::connect(
            registry::endpoint(directory, &self.overrides, target_name).await?,
            None,
        )
        .await?;
        let (s, g) = (source.name().to_owned(), target.name().to_owned());
        let at_source = |e| Error::Db {
            step: Step::Preflight,
            place: Place::Shard(s.clone()),
            source: e,
        };
        let at_target = |e| Error::Db {
            step: Step::Preflight,
            place: Place::Shard(g.clone()),
            source: e,
        };

        let wal_level: String = source
            .client
            .query_one("SELECT current_setting('wal_level')", &[])
            .await
            .map_err(at_source)?
            .get(0);
        let method = match (self.options.method, wal_level == "logical") {
            (MethodChoice::Auto | MethodChoice::Logical, true) => Method::Logical,
            (MethodChoice::Auto | MethodChoice::Copy, _) => Method::Copy,
            (MethodChoice::Logical, false) => {
                return refuse(
                    format!(
                        "source shard {s} has wal_level = {wal_level}; the logical method needs logical"
                    ),
                    format!(
                        "ALTER SYSTEM SET wal_level = logical and restart shard {s} (it also needs \
                         free replication slots and WAL senders), or use --method copy"
                    ),
                );
            }
        };

        let kind = &key.entity_type;
        let tables = catalog::describe(&source.client, kind)
            .await
            .map_err(at_source)?;
        if tables.is_empty() {
            return refuse(
                format!(
                    "no table on source shard {s} is protected for entity type '{kind}': \
                     nothing says where its rows are"
                ),
                format!(
                    "SELECT shard_directory.protect('<table>', '<key column>', '{kind}') for each \
                     table of the entity, on every shard"
                ),
            );
        }
        let on_target = catalog::describe(&target.client, kind)
            .await
            .map_err(at_target)?;
        for t in &tables {
            let (name, key_column) = (&t.name, &t.key_column);
            let protect =
                format!("SELECT shard_directory.protect('{name}', '{key_column}', '{kind}')");
            let Some(there) = on_target.iter().find(|x| x.name == t.name) else {
                return if catalog::exists(&target.client, &t.quoted)
                    .await
                    .map_err(at_target)?
                {
                    refuse(
                        format!(
                            "table {name} exists on target shard {g} but is not protected for \
                             entity type '{kind}'"
                        ),
                        format!("{protect} on shard {g}"),
                    )
                } else {
                    refuse(
                        format!("table {name} is missing on target shard {g}"),
                        format!(
                            "create it on shard {g} with the same columns as on {s}, then {protect} there"
                        ),
                    )
                };
            };
            if there.key_column != t.key_column {
                return refuse(
                    format!(
                        "table {name} is protected with key column {} on target shard {g} but \
                         {key_column} on source shard {s}",
                        there.key_column
                    ),
                    "protect it with the same key column on both shards".into(),
                );
            }
            for c in &t.columns {
                match there.columns.iter().find(|x| x.name == c.name) {
                    None => {
                        return refuse(
                            format!(
                                "column {}.{} ({}) is missing on target shard {g}",
                                name, c.name, c.type_name
                            ),
                            format!(
                                "ALTER TABLE {name} ADD COLUMN {} {} on shard {g}",
                                c.quoted, c.type_name
                            ),
                        )
                    }
                    Some(x) if x.type_name != c.type_name => {
                        return refuse(
                            format!(
                                "column {}.{} is {} on target shard {g} but {} on source shard {s}",
                                name, c.name, x.type_name, c.type_name
                            ),
                            "give it the same type on both shards".into(),
                        )
                    }
                    Some(_) => {}
                }
            }
            if method == Method::Logical && !t.identity_covers_key {
                return refuse(
                    format!(
                        "table {name} on source shard {s}: its replica identity does not include \
                         the key column {key_column}, so a publication filtered on it could not \
                         publish its updates and deletes (and would refuse them)"
                    ),
                    format!(
                        "ALTER TABLE {name} REPLICA IDENTITY FULL, or make {key_column} part of \
                         its primary key, on shard {s}; or use --method copy"
                    ),
                );
            }
        }
        if let Some(table) = purge::first_table_with_rows(&target.client, &tables, key)
            .await
            .map_err(at_target)?
        {
            return refuse(
                format!("target shard {g} already has rows of {key} in table {table}"),
                format!(
                    "delete them first (a move with --keep-source leaves rows behind; \
                     `shard-directory history {kind} {}` shows where the entity has been), or \
                     choose another target",
                    key.entity_id
                ),
            );
        }
        let source_fence = fence::read(&source.client, key).await.map_err(at_source)?;
        if !matches!(source_fence, Fence::None | Fence::Owned { .. }) {
            return refuse(
                format!("{key} is fenced {source_fence} on source shard {s}"),
                format!(
                    "an unfinished move? `shard-directory list` shows open moves; if nothing is \
                     moving it, SELECT shard_directory.unfence('{kind}', '{}') on shard {s}",
                    key.entity_id
                ),
            );
        }
        let target_fence = fence::read(&target.client, key).await.map_err(at_target)?;
        if !matches!(target_fence, Fence::None | Fence::Moved { .. }) {
            return refuse(
                format!(
                    "{key} is fenced {target_fence} on target shard {g}: that shard believes it \
                     holds the entity"
                ),
                format!(
                    "check where its rows are; if not on {g}, SELECT shard_directory.unfence('{kind}', '{}') there",
                    key.entity_id
                ),
            );
        }
        let mut rows = Vec::new();
        for t in &tables {
            let n: i64 = source
                .client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {} WHERE {}",
                        t.quoted,
                        t.entity_predicate()
                    ),
                    &[&key.entity_id],
                )
                .await
                .map_err(at_source)?
                .get(0);
            rows.push((t.name.clone(), n));
        }
        let plan = Plan {
            entity: key.clone(),
            source: s.clone(),
            target: g.clone(),
            method,
            tables: rows,
            source_fence,
            target_fence,
        };
        Ok((plan, tables, source, target))
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

fn stopped(move_id: i64, error: Error) -> Failure {
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
struct Run<'m> {
    mover: &'m Mover,
    directory: Client,
    record: MoveRecord,
    key: EntityKey,
    source: Side,
    target: Side,
    tables: Vec<EntityTable>,
    /// When the freeze must be over; set when this run froze the entity or resumed it frozen.
    deadline: Option<Instant>,
}

impl<'m> Run<'m> {
    fn new(
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

    async fn drive(mut self) -> Result<MoveRecord, Failure> {
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
                return Ok(());
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
    async fn abort(&mut self) -> Result<(), Error> {
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
