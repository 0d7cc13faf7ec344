//! The authoritative store: the directory database, read one round trip per query.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::metrics::Counters;
use crate::name::Name;
use crate::pool::{self, Connector, Timeouts};
use crate::replicas::{Read, Replicas, Versioned};
use crate::statements::Statements;
use tokio_postgres::types::Type;

/// The entry and the global version (and the directory's epoch, `$epoch`), from one snapshot, in
/// one round trip. The version row is read by its key (`WHERE id`): the table bloats under
/// sustained writes.
macro_rules! fetch {
    ($epoch:expr) => {
        concat!(
            "SELECT v.version, d.shard_name, d.target_shard, d.state, d.region, d.version",
            recovering!(),
            $epoch,
            " FROM shard_directory.shard_directory_version v \
             LEFT JOIN shard_directory.shard_directory d \
               ON d.entity_type = $1 AND d.entity_id = $2 \
             WHERE v.id"
        )
    };
}

/// Which server answered, as columns of every read: whether it is a standby (a replica's read is
/// taken only while it is one: a promoted server goes on a history of its own), and which copy of
/// the directory it is ([`server`]): when its postmaster started, and the version table's file
/// (`base/<the database's oid>/<file>`: a database restored beside the directory by rename is
/// another). Plain columns, read without a catalog scan: a subquery on `pg_database` cost each
/// fill a third more of the server's CPU.
macro_rules! recovering {
    () => {
        ", pg_catalog.pg_is_in_recovery() AS recovering, \
         pg_catalog.pg_postmaster_start_time() AS started, \
         pg_catalog.pg_relation_filepath('shard_directory.shard_directory_version') AS file"
    };
}

/// The copy of the directory a row of a read with [`recovering!`]'s columns came from: a
/// restart, a restored copy and a promoted standby each are another, and a version one notified
/// says nothing of another's.
fn server(row: &Row) -> String {
    let started: std::time::SystemTime = row.get("started");
    let micros = started
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let file: Option<&str> = row.get("file");
    format!("{micros} {}", file.unwrap_or_default())
}

/// The directory's epoch, as a column of the reads that carry it.
macro_rules! epoch {
    () => {
        ", shard_directory.directory_epoch() AS epoch"
    };
}

/// A fill's read: with the epoch, and without (an extension older than `directory_epoch()`).
const FETCH: [&str; 2] = [fetch!(epoch!()), fetch!("")];

/// The version's own read: the version, its age (and the epoch).
macro_rules! version {
    ($epoch:expr) => {
        concat!(
            "SELECT version, extract(epoch FROM now() - updated_at)::float8",
            recovering!(),
            $epoch,
            " FROM shard_directory.shard_directory_version WHERE id"
        )
    };
}

/// The version, what changed since and the epoch, from `changes_since($args)`.
macro_rules! changes_since {
    ($args:expr) => {
        concat!(
            "SELECT version, age, complete, entity_types, entity_ids, versions",
            recovering!(),
            epoch!(),
            " FROM shard_directory.changes_since(",
            $args,
            ")"
        )
    };
}

/// What changed since `$1`, up to `$2` keys: a backfill of the change log.
#[cfg(feature = "redis")]
const BACKFILL: &str = changes_since!("$1, $2");

/// How the version is read, best first: with what changed since `$1` and the epoch, from one
/// snapshot, in one round trip; the version and the epoch (a role not granted
/// `changes_since()`); the version alone (an extension older than both). A reader steps down
/// when the directory refuses one and never back up; [`SINCE`] is the one that takes `$1`.
pub(crate) const VERSION_READS: [&str; 3] =
    [changes_since!("$1"), version!(epoch!()), version!("")];

/// The read of [`VERSION_READS`] that says what changed.
pub(crate) const SINCE: usize = 0;

/// The function whose absence (or whose missing grant) makes a reader step down from `read`.
pub(crate) fn needs(read: usize) -> &'static str {
    if read == SINCE {
        "changes_since"
    } else {
        "directory_epoch"
    }
}

/// A fill's read: the entry (`None`: the directory has none), the version it was read at, the
/// directory's epoch then (when the directory can say), and whether the server was a standby.
pub(crate) struct Fetched(pub Option<Entry>, pub i64, pub Option<String>, pub bool);

impl Versioned for Fetched {
    fn read_at(&self) -> Read<'_> {
        Read {
            version: self.1,
            epoch: self.2.as_deref(),
            recovering: self.3,
        }
    }
}

impl Versioned for Changes {
    fn read_at(&self) -> Read<'_> {
        Read {
            version: self.version,
            epoch: self.epoch.as_deref(),
            recovering: self.recovering,
        }
    }
}

/// What a read of the directory's version brought.
#[derive(Debug)]
pub(crate) struct Changes {
    /// The version the read asked about.
    pub since: i64,
    pub version: i64,
    /// How long ago the version changed.
    pub age: Option<Duration>,
    /// Every key changed after `since`, with the latest version that changed it; `None` when
    /// the directory cannot say (history purged, too many changes, no `changes_since()`).
    pub changed: Option<Vec<(EntityKey, i64)>>,
    /// The directory's epoch (`None`: an extension without `directory_epoch()`).
    pub epoch: Option<String>,
    /// Whether the server read was a standby.
    pub recovering: bool,
    /// Which copy of the directory it was: `<postmaster start, µs since 1970> <the version
    /// table's file>` (`None`: not read from a server, a relay's message).
    pub server: Option<String>,
}

impl Changes {
    /// From a row of one of [`VERSION_READS`] (those without `complete` say nothing of what
    /// changed).
    pub fn from_row(since: i64, row: &Row) -> Changes {
        let has = |column: &str| row.columns().iter().any(|c| c.name() == column);
        let changed = (has("complete") && row.get::<_, bool>("complete")).then(|| {
            let types: Vec<String> = row.get::<_, Option<_>>(3).unwrap_or_default();
            let ids: Vec<String> = row.get::<_, Option<_>>(4).unwrap_or_default();
            let versions: Vec<i64> = row.get::<_, Option<_>>(5).unwrap_or_default();
            types
                .into_iter()
                .zip(ids)
                .map(|(t, i)| EntityKey::new(t, i))
                .zip(versions)
                .collect()
        });
        Changes {
            since,
            version: row.get(0),
            age: Duration::try_from_secs_f64(row.get::<_, f64>(1)).ok(),
            changed,
            epoch: has("epoch").then(|| row.get("epoch")),
            recovering: row.get("recovering"),
            server: Some(server(row)),
        }
    }

    /// Whether `e` says `function` cannot be used here; says so once per function.
    pub fn unavailable_as(e: &tokio_postgres::Error, function: &'static str) -> bool {
        use tokio_postgres::error::SqlState;
        let unavailable = e.code().is_some_and(|c| {
            *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::INSUFFICIENT_PRIVILEGE
        });
        if unavailable {
            static WARNED: std::sync::Mutex<Vec<&str>> = std::sync::Mutex::new(Vec::new());
            let mut warned = WARNED.lock().expect("warned lock");
            if !warned.contains(&function) {
                warned.push(function);
                let without = match function {
                    "changes_since" => "every directory change flushes the whole cache",
                    "directory_epoch" => {
                        "a failover or restore that lost the directory's last changes is noticed \
                         only while its version is below the one this client knew"
                    }
                    _ => "a freeze no mover ends stays until an operator aborts its move",
                };
                tracing::warn!(error = %e, "shard_directory.{function}() is not available \
                    (GRANT EXECUTE ON FUNCTION shard_directory.{function} TO this role, or \
                    ALTER EXTENSION shard_directory UPDATE): {without}");
            }
        }
        unavailable
    }
}

pub(crate) struct Store {
    pool: Pool,
    replicas: Replicas,
    counters: Arc<Counters>,
    timeouts: Timeouts,
    statements: Statements,
    /// The best of [`VERSION_READS`] the directory has answered (or not yet refused).
    version_read: AtomicUsize,
    /// The best of [`FETCH`] likewise.
    fetch: AtomicUsize,
    /// When a query last came back, as time since `opened`.
    answered: AtomicU64,
    opened: Instant,
    /// The newest version the primary itself read, where: a replica's read above it is not
    /// taken, so that a standby still serving a history the primary went back from (a restore)
    /// cannot bring that history back.
    confirmed: std::sync::Mutex<Said>,
    /// The newest version notified, where the watcher's session heard it: trusted as far as
    /// the primary read while that is the same server in the same epoch, unless the directory
    /// went back in this epoch.
    notified: std::sync::Mutex<Said>,
}

/// A version, and where it was said: the directory's epoch (`None`: an extension without one)
/// and the server ([`Changes::server`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    epoch: Option<String>,
    server: Option<String>,
    version: i64,
}

impl Said {
    const NOTHING: Said = Said {
        epoch: None,
        server: None,
        version: i64::MIN,
    };

    fn at(&self, epoch: Option<&str>, server: Option<&str>) -> bool {
        self.epoch.as_deref() == epoch && self.server.as_deref() == server
    }
}

/// A connection-level failure means "unreachable", and so does a server that answers only to
/// say it is shutting down, starting up or cannot take connections (57P01-57P03, class 08): the
/// outage policy covers both. Any other error the server sent means it answered.
pub(crate) fn classify(e: tokio_postgres::Error) -> Error {
    if e.as_db_error().is_none() || crate::error::connection_lost(&e) {
        Error::DirectoryUnavailable(e)
    } else {
        Error::Directory(e)
    }
}

/// `answering`: whether the directory answered a query of this pool while the wait lasted; a
/// wait for a free connection then ran out because this client is busy, not the directory.
fn pool_error(e: deadpool_postgres::PoolError, timeouts: Timeouts, answering: bool) -> Error {
    use deadpool_postgres::{PoolError, TimeoutType};
    match e {
        PoolError::Backend(e) => classify(e),
        PoolError::Timeout(TimeoutType::Create) => Error::DirectoryTimeout {
            what: "a new connection",
            after: timeouts.connect,
        },
        PoolError::Timeout(_) if answering => Error::DirectoryBusy {
            after: timeouts.query,
        },
        PoolError::Timeout(_) => Error::DirectoryTimeout {
            what: "a pooled connection",
            after: timeouts.query,
        },
        other => Error::Config(format!("directory pool: {other}")),
    }
}

impl Store {
    pub fn new(
        config: tokio_postgres::Config,
        size: usize,
        timeouts: Timeouts,
        statements: Statements,
        tls: &Connector,
        counters: Arc<Counters>,
        replicas: Replicas,
    ) -> Result<Store> {
        let pool = pool::build(config, size, timeouts, tls)
            .map_err(|e| Error::Config(format!("directory pool: {e}")))?;
        Ok(Store {
            pool,
            replicas,
            counters,
            timeouts,
            statements,
            version_read: AtomicUsize::new(SINCE),
            fetch: AtomicUsize::new(0),
            answered: AtomicU64::new(0),
            opened: Instant::now(),
            confirmed: std::sync::Mutex::new(Said::NOTHING),
            notified: std::sync::Mutex::new(Said::NOTHING),
        })
    }

    /// Runs `sql` on a pooled connection: the wait for one and the query each within the query
    /// timeout. A connection whose query ran out of time is closed, not handed to the next query
    /// to wait behind it.
    async fn query<const N: usize>(
        &self,
        pool: &Pool,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Vec<Row>> {
        self.counters.store_query();
        let timeouts = self.timeouts;
        let waited = self.since_opened();
        // Whether the directory answers is the primary's to say.
        let primary = self.is_primary(pool);
        let client = pool.get().await.map_err(|e| {
            let answering = primary && self.answered.load(Ordering::Relaxed) > waited;
            pool_error(e, timeouts, answering)
        })?;
        let query = self.statements.query(&client, &**client, sql, params);
        match tokio::time::timeout(timeouts.query, query).await {
            Ok(rows) => {
                if primary {
                    self.answered
                        .fetch_max(self.since_opened(), Ordering::Relaxed);
                }
                rows.map_err(classify)
            }
            Err(_) => {
                drop(deadpool_postgres::Object::take(client));
                Err(Error::DirectoryTimeout {
                    what: "a query",
                    after: timeouts.query,
                })
            }
        }
    }

    fn is_primary(&self, pool: &Pool) -> bool {
        std::ptr::eq(pool, &self.pool)
    }

    /// The primary (`server`) read `version` in `epoch`. Below what it said before there: an
    /// older read ended late (a server never goes back in its own epoch; a restore is another
    /// server); replicas are trusted only up to it until the primary says more.
    pub fn primary_said(&self, epoch: Option<&str>, server: Option<&str>, version: i64) {
        *self.confirmed.lock().expect("confirmed lock") = Said {
            epoch: epoch.map(str::to_owned),
            server: server.map(str::to_owned),
            version,
        };
    }

    /// The watcher's LISTEN session, on `server`, heard `version` notified in `epoch` (a hint:
    /// anyone may NOTIFY).
    pub fn primary_notified(&self, epoch: Option<&str>, server: Option<&str>, version: i64) {
        let mut notified = self.notified.lock().expect("notified lock");
        if notified.at(epoch, server) {
            notified.version = notified.version.max(version);
        } else {
            *notified = Said {
                epoch: epoch.map(str::to_owned),
                server: server.map(str::to_owned),
                version,
            };
        }
    }

    /// What replicas may serve: reads in the primary's epoch up to the version it read; up to
    /// the version notified too when `trust_notified` (the directory did not go back in this
    /// epoch) and the notification was heard from the same server in the same epoch. A version
    /// notified by another server (one restored since, or replaced by a promotion) or in another
    /// epoch (the first change of a restored copy, which mints a lineage) says nothing of the
    /// epoch the primary read: a standby left on a lost history answers at that version in it.
    fn confirmed(&self, trust_notified: bool) -> (Option<String>, i64) {
        let said = self.confirmed.lock().expect("confirmed lock").clone();
        let notified = self.notified.lock().expect("notified lock");
        let at = notified.at(said.epoch.as_deref(), said.server.as_deref());
        let version = match trust_notified && at {
            true => said.version.max(notified.version),
            false => said.version,
        };
        (said.epoch, version)
    }

    fn since_opened(&self) -> u64 {
        self.opened.elapsed().as_micros() as u64
    }

    /// `sql`'s one row, on the primary.
    async fn query_one<const N: usize>(
        &self,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Row> {
        self.query_one_on(&self.pool, sql, params).await
    }

    /// `sql`'s one row, on `pool`.
    async fn query_one_on<const N: usize>(
        &self,
        pool: &Pool,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Row> {
        let rows = self.query(pool, sql, params).await?;
        // Only when the version row is gone: not a directory database, or a broken one.
        rows.into_iter().next().ok_or_else(|| {
            Error::Config(format!(
                "the directory database has no shard_directory_version row (query: {sql})"
            ))
        })
    }

    /// The entity's entry (None if it has none), the global version it was read at, and the
    /// directory's epoch then (when the directory can say): from a replica that has replayed
    /// `at_least` in the epoch `history` (see [`Store::confirmed`] for `trust_notified`), else
    /// from the primary.
    pub async fn fetch(
        &self,
        key: &EntityKey,
        at_least: i64,
        history: Option<&str>,
        trust_notified: bool,
    ) -> Result<Fetched> {
        let on_replica = |pool| Box::pin(self.fetch_on(pool, key)) as _;
        let confirmed = self.confirmed(trust_notified);
        match self
            .replicas
            .read(at_least, history, &confirmed, &self.counters, on_replica)
            .await
        {
            Some(found) => Ok(found),
            None => self.fetch_on(&self.pool, key).await,
        }
    }

    async fn fetch_on(&self, pool: &Pool, key: &EntityKey) -> Result<Fetched> {
        let row = loop {
            let read = self.fetch.load(Ordering::Relaxed);
            let params: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key.entity_type, Type::TEXT), (&key.entity_id, Type::TEXT)];
            match self.query_one_on(pool, FETCH[read], params).await {
                Err(Error::Directory(e))
                    if read == 0 && Changes::unavailable_as(&e, "directory_epoch") =>
                {
                    self.fetch.store(1, Ordering::Relaxed)
                }
                row => break row?,
            }
        };
        let directory_version: i64 = row.get(0);
        let entry = row.get::<_, Option<&str>>(1).map(|shard_name| Entry {
            shard_name: Name::new(shard_name),
            target_shard: row.get::<_, Option<&str>>(2).map(Name::new),
            // A state this client does not know is treated as the most restrictive one.
            state: row.get::<_, &str>(3).parse().unwrap_or(State::ReadOnly),
            region: row.get::<_, Option<&str>>(4).map(Name::new),
            version: row.get(5),
            directory_version,
        });
        let (recovering, server) = (row.get("recovering"), server(&row));
        let epoch = row
            .columns()
            .iter()
            .any(|c| c.name() == "epoch")
            .then(|| row.get("epoch"));
        if self.is_primary(pool) {
            self.primary_said(epoch.as_deref(), Some(&server), directory_version);
        }
        Ok(Fetched(entry, directory_version, epoch, recovering))
    }

    /// The registry's `conninfo` of `shard`, if the shard is registered with one.
    pub async fn conninfo(&self, shard: &str) -> Result<Option<String>> {
        let rows = self
            .query(
                &self.pool,
                "SELECT conninfo FROM shard_directory.shards WHERE shard_name = $1",
                [(&shard, Type::TEXT)],
            )
            .await?;
        Ok(rows.first().and_then(|r| r.get(0)))
    }

    /// Releases `key` from a freeze whose lease ended with no cutover (`release_expired_freeze`):
    /// the new version, or `None` when there was nothing to release. A directory that cannot
    /// (older than 0.2.0, or this role not granted it) answers `None` too, said once.
    pub async fn release_expired_freeze(&self, key: &EntityKey) -> Result<Option<i64>> {
        let released = self
            .query_one(
                "SELECT shard_directory.release_expired_freeze($1, $2)",
                [(&key.entity_type, Type::TEXT), (&key.entity_id, Type::TEXT)],
            )
            .await;
        match released {
            Ok(row) => Ok(row.get(0)),
            Err(Error::Directory(e)) if Changes::unavailable_as(&e, "release_expired_freeze") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The global version (and the epoch), nothing said of what changed.
    pub async fn current_version(&self) -> Result<Changes> {
        self.read_version(&self.pool, None).await
    }

    /// The global version and what changed since `since`.
    pub async fn changes_since(&self, since: i64) -> Result<Changes> {
        self.read_version(&self.pool, Some(since)).await
    }

    /// [`Store::changes_since`] read on a replica that has replayed `at_least` in the epoch
    /// `history`; `None` when none could (the caller reads the primary).
    pub async fn changes_on_replica(
        &self,
        since: i64,
        at_least: i64,
        history: Option<&str>,
        trust_notified: bool,
    ) -> Option<Changes> {
        let on_replica = |pool| Box::pin(self.read_version(pool, Some(since))) as _;
        let confirmed = self.confirmed(trust_notified);
        self.replicas
            .read(at_least, history, &confirmed, &self.counters, on_replica)
            .await
    }

    /// What changed since `since`, when at most `max` keys did (`changed` is `None` past it).
    #[cfg(feature = "redis")]
    pub async fn backfill(&self, since: i64, max: usize) -> Result<Changes> {
        let max = i32::try_from(max).unwrap_or(i32::MAX);
        let row = self
            .query_one(BACKFILL, [(&since, Type::INT8), (&max, Type::INT4)])
            .await?;
        Ok(Changes::from_row(since, &row))
    }

    /// The best of [`VERSION_READS`] the directory answers (from [`SINCE`] on if `since`).
    async fn read_version(&self, pool: &Pool, since: Option<i64>) -> Result<Changes> {
        loop {
            let known = self.version_read.load(Ordering::Relaxed);
            let read = known.max(if since.is_some() { SINCE } else { SINCE + 1 });
            let row = match since {
                Some(since) if read == SINCE => {
                    self.query_one_on(pool, VERSION_READS[read], [(&since, Type::INT8)])
                        .await
                }
                _ => self.query_one_on(pool, VERSION_READS[read], []).await,
            };
            match row {
                Err(Error::Directory(e))
                    if read + 1 < VERSION_READS.len()
                        && Changes::unavailable_as(&e, needs(read)) =>
                {
                    self.version_read.fetch_max(read + 1, Ordering::Relaxed);
                }
                row => {
                    let changes = Changes::from_row(since.unwrap_or(0), &row?);
                    if self.is_primary(pool) {
                        self.primary_said(
                            changes.epoch.as_deref(),
                            changes.server.as_deref(),
                            changes.version,
                        );
                    }
                    return Ok(changes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store on an address nothing listens at: its pools connect only when a query asks.
    fn store() -> Store {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            query: Duration::from_secs(1),
        };
        let tls = Connector::platform().expect("a connector");
        let config: tokio_postgres::Config = "host=127.0.0.1 port=1".parse().unwrap();
        let replicas = Replicas::new(Vec::new(), 1, timeouts, &tls, Duration::ZERO).unwrap();
        let counters = Arc::new(Counters::default());
        Store::new(
            config,
            1,
            timeouts,
            Statements::Prepared,
            &tls,
            counters,
            replicas,
        )
        .unwrap()
    }

    const E: Option<&str> = Some("1.aa");
    const S: Option<&str> = Some("100.5");

    #[test]
    fn a_version_notified_by_the_server_the_primary_read_is_trusted_in_its_epoch() {
        let s = store();
        s.primary_said(E, S, 20);
        s.primary_notified(E, S, 21);
        assert_eq!(s.confirmed(true), (E.map(str::to_owned), 21));
        assert_eq!(
            s.confirmed(false),
            (E.map(str::to_owned), 20),
            "after going back"
        );
        s.primary_notified(E, S, 19);
        assert_eq!(s.confirmed(true).1, 21, "the newest notified");
    }

    /// A restored copy (another server, the same epoch until it changes) says nothing of what
    /// the server before it notified, however late the watcher takes that notification.
    #[test]
    fn a_version_notified_by_another_server_is_not_trusted() {
        let s = store();
        s.primary_said(E, S, 20);
        s.primary_notified(E, Some("99.5"), 21);
        assert_eq!(s.confirmed(true).1, 20);
        s.primary_said(E, Some("99.5"), 20);
        assert_eq!(
            s.confirmed(true).1,
            21,
            "once the primary read is that server's"
        );
    }

    /// The first change of a restored copy mints an epoch: the version it notifies is that
    /// epoch's, not the one the primary read.
    #[test]
    fn a_version_notified_in_another_epoch_is_not_trusted() {
        let s = store();
        s.primary_said(E, S, 20);
        s.primary_notified(Some("1.bb"), S, 21);
        assert_eq!(s.confirmed(true), (E.map(str::to_owned), 20));
        s.primary_said(Some("1.bb"), S, 21);
        s.primary_notified(Some("1.bb"), S, 22);
        assert_eq!(s.confirmed(true), (Some("1.bb".to_owned()), 22));
    }
}
