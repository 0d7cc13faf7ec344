//! Writes of the directory in a replica's session are refused: with `session_replication_role
//! = replica` (a logical replication worker's, or a superuser's session) the directory's ordinary
//! triggers would not run, and they make its rules, versions, history and notifications.

use pgrx::prelude::*;

use crate::error::{spi, SdError};

/// Refuses a write of `table` (one of the directory's) in a replica's session, saying whether it
/// is a logical replication worker's (a subscription copying the directory). The row guards
/// that call this fire in that role too (ENABLE ALWAYS).
pub fn refuse_replica_role(table: &'static str) {
    // SAFETY: reads a setting of the backend's.
    let replica = unsafe { pg_sys::SessionReplicationRole }
        == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
    if !replica {
        return;
    }
    // SAFETY: reads the backend's worker state.
    if unsafe { pg_sys::IsLogicalWorker() } {
        SdError::LogicalReplicaWrite { table }.raise()
    }
    SdError::ReplicaWrite { table }.raise()
}

/// The first publication (by name) among `$1` (every one when NULL) that carries one of the
/// directory's tables, with the table: named, by its schema, or among all tables of a database
/// that holds a directory (its version above 0, or `$2`, as it is first changed: a shard's
/// unused directory tables may go with the rest of its tables).
const PUBLISHED: &str = "\
    SELECT t.pubname::text, t.tablename::text
      FROM pg_catalog.pg_publication_tables t
      JOIN pg_catalog.pg_publication p ON p.pubname = t.pubname
     WHERE t.schemaname = 'shard_directory'
       AND t.tablename IN ('shard_directory', 'shard_directory_version', 'shard_directory_history')
       AND (NOT p.puballtables OR $2 OR shard_directory.current_version() > 0)
       AND ($1::oid[] IS NULL OR p.oid = ANY ($1))
     ORDER BY 1, 2";

/// Refuses a publication that would carry the directory's tables: those among `publications`
/// (the ones a CREATE or ALTER PUBLICATION made or changed, which the event trigger
/// `shard_directory_refuse_publication` passes), or every one when NULL or empty (as the
/// extension is made or updated). The DBA setting up a logical copy hears it there, not later
/// in the subscriber's log.
#[pg_extern(volatile)]
fn check_publications(publications: default!(Option<Vec<Option<pg_sys::Oid>>>, "NULL")) {
    let only: Option<Vec<pg_sys::Oid>> = publications
        .map(|p| p.into_iter().flatten().collect::<Vec<_>>())
        .filter(|p| !p.is_empty());
    refuse_publications(only, false);
}

/// Refuses the first of `only` (every publication when `None`) that carries the directory's
/// tables: at CREATE and ALTER PUBLICATION, and (`first`) as the directory is first changed,
/// which a publication of all tables made while the database held no directory yet would carry.
pub fn refuse_publications(only: Option<Vec<pg_sys::Oid>>, first: bool) {
    let published = spi(
        "read the publications",
        Spi::connect(|c| {
            let rows = c.select(PUBLISHED, Some(1), &[only.into(), first.into()])?;
            if rows.is_empty() {
                return Ok::<_, pgrx::spi::SpiError>(None);
            }
            rows.first().get_two::<String, String>().map(Some)
        }),
    );
    if let Some((Some(publication), Some(table))) = published {
        SdError::PublishedDirectory { publication, table }.raise()
    }
}
