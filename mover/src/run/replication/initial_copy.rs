//! Method `logical` with a pace (`--max-rate`, `--max-lag`): the mover copies the entity's rows
//! itself, at that pace, instead of the subscription's own initial copy, which PostgreSQL runs as
//! fast as it can. The copy reads a snapshot that matches a position of the move's slot exactly,
//! so the subscription, turned on once the copy is in, streams every change of the entity the
//! snapshot misses and none it holds:
//!
//! 1. the slot, and a subscription that is off and copies nothing, are made;
//! 2. a session of the source takes the check's exclusive lock (a fence change it never
//!    commits): every checked transaction of the shard, which every write of a protected table
//!    is, has ended, and new ones wait;
//! 3. meanwhile a second session takes the copy's snapshot and reads the WAL insert position;
//! 4. the lock is let go (the shard's writers waited milliseconds; none was refused) and the slot
//!    is moved to that position: a write of the entity committed before it, and is in the
//!    snapshot, or after it, and is streamed;
//! 5. the rows are copied from the snapshot into one target transaction, paced; then the
//!    subscription is turned on.
//!
//! A resume while copying starts again from 1. The online check and the check under the freeze
//! still compare every row, so a write that got past the lock would abort the move, named.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shard_directory_protocol::EntityKey;
use tokio_postgres::{Client, Transaction};

use crate::directory::record::{self, TableProgress};
use crate::error::{At, Error, Place, Step};
use crate::report::observer::Observer;
use crate::report::progress::Rates;
use crate::run::cleanup::throttle::Throttle;
use crate::run::copy::rows::{self, Pace};
use crate::run::replication::logical;
use crate::shards::fence::{self, Fence};
use crate::shards::side::Side;

/// What the comment of a paced move's subscription adds to the move's signature: a run that
/// finds it while copying knows the copy is the mover's, not the subscription's.
pub(crate) fn signature(move_signature: &str) -> String {
    format!("{move_signature}, copied by the mover")
}

/// Takes the copy's snapshot on `read` and moves the slot `slot` to the WAL position it matches,
/// holding the check's lock on `lock` meanwhile (taken as patiently as a fence).
pub(crate) async fn snapshot_at_slot<'r>(
    source: &Side,
    (lock, read): (&Client, &'r mut Client),
    key: &EntityKey,
    slot: &str,
    patience: Duration,
) -> Result<Transaction<'r>, Error> {
    let shard = source.name();
    fence::patiently(patience, || async {
        lock.batch_execute("BEGIN").await?;
        let held = fence::set(lock, key, &Fence::Frozen).await;
        if held.is_err() {
            lock.batch_execute("ROLLBACK").await?;
        }
        held
    })
    .await
    .at(Step::Sync, shard)?;
    let taken = async {
        let snapshot = rows::snapshot(read, shard, Step::Sync).await?;
        let lsn: String = snapshot
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .at(Step::Sync, shard)?
            .get(0);
        Ok::<_, Error>((snapshot, lsn))
    }
    .await;
    lock.batch_execute("ROLLBACK").await.at(Step::Sync, shard)?;
    let (snapshot, lsn) = taken?;
    logical::advance_to(&source.client, slot, &lsn)
        .await
        .at(Step::Sync, shard)?;
    logical::persist_slots(&source.client, shard)
        .await
        .at(Step::Sync, shard)?;
    Ok(snapshot)
}

/// The pace of the mover's initial copy: each table's progress reported and, every second,
/// recorded (for `status`) with the slot's WAL checked; then the throttle's wait, against the
/// target's standbys.
pub(crate) struct Paced<'a> {
    pub move_id: i64,
    pub throttle: Throttle,
    pub target: (&'a Client, &'a str),
    pub source: (&'a Client, &'a str),
    pub slot: (&'a str, i64),
    pub directory: &'a Client,
    pub tables: &'a mut BTreeMap<String, TableProgress>,
    pub rates: &'a mut Rates,
    pub observer: &'a dyn Observer,
    pub saved: Instant,
}

impl Pace for Paced<'_> {
    fn every(&self) -> u64 {
        self.throttle.step()
    }

    async fn after(&mut self, table: &str, done: u64, rows: u64) -> Result<(), Error> {
        if let Some(p) = self.tables.get_mut(table) {
            p.copied = done as i64;
            (p.rows_per_second, p.eta_seconds) =
                self.rates.update(table, (p.copied, p.rows), Instant::now());
            self.observer.rows(self.move_id, table, p.copied, p.rows);
        }
        if self.saved.elapsed() >= Duration::from_secs(1) {
            record::set_tables(self.directory, self.move_id, self.tables)
                .await
                .at(Step::Record, Place::Directory)?;
            let (name, limit) = self.slot;
            logical::check_slot(self.source, (self.move_id, name), limit, Step::Sync).await?;
            self.saved = Instant::now();
        }
        let (target, shard) = self.target;
        self.throttle
            .after(target, rows)
            .await
            .at(Step::Sync, shard)?;
        Ok(())
    }
}
