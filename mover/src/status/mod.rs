//! What `status` reports beyond the record: who drives the move now, and what its replication
//! slot keeps on the source, and what stopped a way back. Its JSON form is stable for scripts
//! (`schema_version`).

pub(crate) mod slots;
pub(crate) mod way_back;

use serde::Serialize;
use tokio_postgres::Client;

use crate::directory::phase::Phase;
use crate::directory::record::{Method, MoveRecord};
use crate::run::replication::logical;

/// The JSON form's version: raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// One move as `status --json` prints it: the record's fields, and what the servers say now.
#[derive(Debug, Clone, Serialize)]
pub struct MoveStatus {
    pub schema_version: u32,
    #[serde(flatten)]
    pub record: MoveRecord,
    /// The process that holds the move's lock, if one does.
    pub driver: Option<Driver>,
    /// The move's slot on the source, while it exists (logical moves); a reversible move's way
    /// back's, on its target (not `active`: the way back is not streaming).
    pub slot: Option<Slot>,
    /// The value that stops a reversible move's way back, when one does (its slot not streaming):
    /// the source cannot read it.
    pub way_back_stopped_by: Option<way_back::Unreadable>,
}

/// A session that holds a move's lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Driver {
    pub pid: i32,
    pub application_name: String,
    /// The client's host name or address; `local` over a Unix socket.
    pub host: String,
    /// When its session began (RFC 3339, UTC).
    pub since: String,
}

impl std::fmt::Display for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}, on {}, since {})",
            self.pid, self.application_name, self.host, self.since
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Slot {
    pub shard: String,
    pub name: String,
    /// WAL the slot keeps on the source, from its restart position.
    pub retained_wal_bytes: i64,
    /// How far its consumer is behind the source's WAL, from the position it confirmed: the
    /// lag a catch-up waits out. `None` before it confirmed any.
    pub lag_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreserved` or `lost` (`max_slot_wal_keep_size`).
    pub wal_status: Option<String>,
    pub active: bool,
}

/// The shard and name of the slot an open move streams through, if it has one: a logical
/// move's on its source; a reversible move's way back's on its target.
pub(crate) fn slot_of(record: &MoveRecord) -> Option<(&str, String)> {
    if record.phase.is_finished() {
        return None;
    }
    match record.phase {
        Phase::Reversible => Some((&record.target_shard, logical::way_back_name(record.move_id))),
        _ if record.method == Method::Logical => {
            Some((&record.source_shard, record.replication_name.clone()))
        }
        _ => None,
    }
}

/// The session holding the advisory lock `(class, key)` in this database, if any.
pub(crate) async fn driver(
    directory: &Client,
    class: i32,
    key: i32,
) -> Result<Option<Driver>, tokio_postgres::Error> {
    let row = directory
        .query_opt(
            "SELECT a.pid, a.application_name, \
                    coalesce(a.client_hostname, host(a.client_addr), 'local'), \
                    to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = ($1::int8 & 4294967295)::oid AND l.objid = ($2::int8 & 4294967295)::oid",
            &[&i64::from(class), &i64::from(key)],
        )
        .await?;
    Ok(row.map(|r| Driver {
        pid: r.get(0),
        application_name: r.get(1),
        host: r.get(2),
        since: r.get(3),
    }))
}

/// The slot named `name` on `source`, if it exists.
pub(crate) async fn slot(
    source: &Client,
    shard: &str,
    name: &str,
) -> Result<Option<Slot>, tokio_postgres::Error> {
    let row = source
        .query_opt(
            "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, 0), \
                    wal_status, active, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    Ok(row.map(|r| Slot {
        shard: shard.to_owned(),
        name: name.to_owned(),
        retained_wal_bytes: r.get(0),
        lag_bytes: r.get(3),
        wal_status: r.get(1),
        active: r.get(2),
    }))
}
