//! Streaming an entity's rows from a snapshot of the source (`COPY ... TO STDOUT`) into the target
//! (`COPY ... FROM STDIN`) in one target transaction, so a copy is there whole or not at all.
//! Rows an interrupted earlier attempt committed are deleted first. Method `copy` copies so while
//! the entity is frozen, as fast as it goes; method `logical` so when asked to pace its initial
//! copy (`initial_copy`).
//!
//! The copy does not run the rows through the target's own triggers (`triggers`), as logical
//! apply does not: where one would fire, it runs as `session_replication_role = replica`.
//!
//! Binary where it is sure to read back the same ([`EntityTable::binary_copy`]: between majors
//! only for PostgreSQL's own types), text otherwise: the mover's sessions pin every setting that
//! shapes a value's text (`registry`), so text reads back the same on any shard.

use futures_util::{SinkExt, StreamExt};
use shard_directory_protocol::EntityKey;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::run::copy::triggers;
use crate::shards::catalog::{BinaryCopy, EntityTable};
use crate::shards::fence;

/// What a copy does between its rows: reports them, and waits when told to go slower.
pub(crate) trait Pace {
    /// Rows between two calls of [`Pace::after`]; a table's last call comes at its end.
    fn every(&self) -> u64;
    /// `rows` more rows of `table` (`done` so far) have gone to the target.
    async fn after(&mut self, table: &str, done: u64, rows: u64) -> Result<(), Error>;
}

/// As fast as it goes, each table reported once it is in.
pub(crate) struct Unpaced<F>(pub F);

impl<F: FnMut(&str, u64)> Pace for Unpaced<F> {
    fn every(&self) -> u64 {
        u64::MAX
    }

    async fn after(&mut self, table: &str, done: u64, _rows: u64) -> Result<(), Error> {
        (self.0)(table, done);
        Ok(())
    }
}

/// A read-only REPEATABLE READ transaction on `source`: one snapshot for every table, taken by
/// its first statement.
pub(crate) async fn snapshot<'a>(
    source: &'a mut Client,
    name: &str,
    step: Step,
) -> Result<Transaction<'a>, Error> {
    source
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .at(step, name)
}

/// Copies the entity's rows of every table (parents first) from the snapshot `read`, telling
/// `pace` as they go.
pub(crate) async fn copy_rows(
    (read, source_name): (&Transaction<'_>, &str),
    (target, target_name): (&mut Client, &str),
    (tables, key, version): (&[EntityTable], &EntityKey, i64),
    step: Step,
    pace: &mut impl Pace,
) -> Result<(), Error> {
    let at_table = |shard: &str, t: &EntityTable| Place::Table {
        shard: shard.to_owned(),
        table: t.name.clone(),
    };
    let literal: String = read
        .query_one("SELECT quote_literal($1)", &[&key.entity_id])
        .await
        .at(step, source_name)?
        .get(0);
    let major = "SELECT current_setting('server_version_num')::int / 10000";
    let source_major: i32 = read
        .query_one(major, &[])
        .await
        .at(step, source_name)?
        .get(0);
    let replica = triggers::copy_as_replica(target, target_name, tables, step).await?;
    let write = target.transaction().await.at(step, target_name)?;
    if replica {
        write
            .batch_execute("SET LOCAL session_replication_role = replica")
            .await
            .at(step, target_name)?;
    }
    let target_major: i32 = write
        .query_one(major, &[])
        .await
        .at(step, target_name)?
        .get(0);
    fence::bypass(&write, key, version)
        .await
        .at(step, target_name)?;
    for t in tables.iter().rev() {
        write
            .execute(
                &format!("DELETE FROM {} WHERE {}", t.quoted, t.entity_predicate()),
                &[&key.entity_id],
            )
            .await
            .at(step, at_table(target_name, t))?;
    }
    let every = pace.every();
    for t in tables {
        point!("copy.table.{:?}", step);
        let columns = t.column_list();
        let format = match t.binary_copy {
            BinaryCopy::AnyMajor => "binary",
            BinaryCopy::SameMajor if source_major == target_major => "binary",
            _ => "text",
        };
        let out = read
            .copy_out(&format!(
                "COPY (SELECT {columns} FROM {} WHERE {} = ({literal}::text)::{}) TO STDOUT (FORMAT {format})",
                t.quoted, t.key_quoted, t.key_type
            ))
            .await
            .at(step, at_table(source_name, t))?;
        let sink = write
            .copy_in(&format!(
                "COPY {} ({columns}) FROM STDIN (FORMAT {format})",
                t.quoted
            ))
            .await
            .at(step, at_table(target_name, t))?;
        futures_util::pin_mut!(out, sink);
        // The server sends a row per message (the binary trailer is one more), so messages count
        // rows for the pace; the table's total is the one COPY FROM reports.
        let (mut done, mut since) = (0u64, 0u64);
        while let Some(chunk) = out.next().await {
            let chunk = chunk.at(step, at_table(source_name, t))?;
            sink.send(chunk).await.at(step, at_table(target_name, t))?;
            since += 1;
            if since >= every {
                done += since;
                pace.after(&t.name, done, since).await?;
                since = 0;
            }
        }
        let rows = sink
            .as_mut()
            .finish()
            .await
            .at(step, at_table(target_name, t))?;
        pace.after(&t.name, rows, rows.saturating_sub(done)).await?;
    }
    point!("copy.commit.{:?}", step);
    write.commit().await.at(step, target_name)
}
