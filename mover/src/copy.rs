//! Method `copy`: while the entity is frozen, its rows stream from the source (`COPY ... TO STDOUT`)
//! into the target (`COPY ... FROM STDIN`) in one target transaction, so a copy is there whole or
//! not at all. Rows an interrupted earlier attempt committed are deleted first.
//!
//! Binary where it is sure to read back the same ([`EntityTable::binary_copy`], both shards on
//! one PostgreSQL major), text otherwise: the mover's sessions pin every setting that shapes a
//! value's text (`registry`), so text reads back the same on any shard.

use futures_util::{SinkExt, StreamExt};
use shard_directory_protocol::EntityKey;
use tokio_postgres::{Client, IsolationLevel};

use crate::catalog::EntityTable;
use crate::error::{At, Error, Place, Step};
use crate::fence;

/// Copies the entity's rows of every table (parents first); returns the rows copied per table.
pub(crate) async fn copy_rows(
    (source, source_name): (&mut Client, &str),
    (target, target_name): (&mut Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
    version: i64,
    mut copied: impl FnMut(&str, u64),
) -> Result<(), Error> {
    let at_table = |shard: &str, t: &EntityTable| Place::Table {
        shard: shard.to_owned(),
        table: t.name.clone(),
    };
    // The source side is frozen, so its rows hold still; one snapshot makes that explicit.
    let read = source
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .at(Step::Copy, source_name)?;
    let literal: String = read
        .query_one("SELECT quote_literal($1)", &[&key.entity_id])
        .await
        .at(Step::Copy, source_name)?
        .get(0);
    let major = "SELECT current_setting('server_version_num')::int / 10000";
    let source_major: i32 = read
        .query_one(major, &[])
        .await
        .at(Step::Copy, source_name)?
        .get(0);
    let write = target.transaction().await.at(Step::Copy, target_name)?;
    let target_major: i32 = write
        .query_one(major, &[])
        .await
        .at(Step::Copy, target_name)?
        .get(0);
    fence::bypass(&write, key, version)
        .await
        .at(Step::Copy, target_name)?;
    for t in tables.iter().rev() {
        write
            .execute(
                &format!("DELETE FROM {} WHERE {}", t.quoted, t.entity_predicate()),
                &[&key.entity_id],
            )
            .await
            .at(Step::Copy, at_table(target_name, t))?;
    }
    for t in tables {
        let columns = t.column_list();
        let format = if t.binary_copy && source_major == target_major {
            "binary"
        } else {
            "text"
        };
        let out = read
            .copy_out(&format!(
                "COPY (SELECT {columns} FROM {} WHERE {} = ({literal}::text)::{}) TO STDOUT (FORMAT {format})",
                t.quoted, t.key_quoted, t.key_type
            ))
            .await
            .at(Step::Copy, at_table(source_name, t))?;
        let sink = write
            .copy_in(&format!(
                "COPY {} ({columns}) FROM STDIN (FORMAT {format})",
                t.quoted
            ))
            .await
            .at(Step::Copy, at_table(target_name, t))?;
        futures_util::pin_mut!(out, sink);
        while let Some(chunk) = out.next().await {
            let chunk = chunk.at(Step::Copy, at_table(source_name, t))?;
            sink.send(chunk)
                .await
                .at(Step::Copy, at_table(target_name, t))?;
        }
        let rows = sink
            .as_mut()
            .finish()
            .await
            .at(Step::Copy, at_table(target_name, t))?;
        copied(&t.name, rows);
    }
    write.commit().await.at(Step::Copy, target_name)?;
    read.commit().await.at(Step::Copy, source_name)
}
