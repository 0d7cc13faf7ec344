//! Deleting an entity's rows from one shard, in batches, through the fence bypass: from the source
//! once the target owns the entity, from the target when a move is aborted. Children before the
//! tables they reference.

use shard_directory_client::EntityKey;
use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::error::{At, Error, Place, Step};
use crate::fence;

/// Deletes every row of the entity in `tables` (given parents first), `batch` rows per
/// transaction; calls `deleted(table, rows so far)` after each batch.
pub(crate) async fn delete_rows(
    (client, shard): (&mut Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
    version: i64,
    batch: i64,
    step: Step,
    mut deleted: impl FnMut(&str, u64),
) -> Result<(), Error> {
    for t in tables.iter().rev() {
        let at = || Place::Table {
            shard: shard.to_owned(),
            table: t.name.clone(),
        };
        // The predicate is repeated outside the ctid list: on a partitioned table a ctid names a
        // row in each partition.
        let predicate = t.entity_predicate();
        let sql = format!(
            "DELETE FROM {table} WHERE {predicate} \
             AND ctid = ANY (ARRAY(SELECT ctid FROM {table} WHERE {predicate} LIMIT $2))",
            table = t.quoted
        );
        let mut total = 0;
        loop {
            let tx = client.transaction().await.at(step, at())?;
            fence::bypass(&tx, key, version).await.at(step, at())?;
            let n = tx
                .execute(&sql, &[&key.entity_id, &batch])
                .await
                .at(step, at())?;
            tx.commit().await.at(step, at())?;
            if n == 0 {
                break;
            }
            total += n;
            deleted(&t.name, total);
        }
    }
    Ok(())
}

/// Whether the shard holds any row of the entity, and in which table first.
pub(crate) async fn first_table_with_rows(
    client: &Client,
    tables: &[EntityTable],
    key: &EntityKey,
) -> Result<Option<String>, tokio_postgres::Error> {
    for t in tables {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE {})",
            t.quoted,
            t.entity_predicate()
        );
        if client.query_one(&sql, &[&key.entity_id]).await?.get(0) {
            return Ok(Some(t.name.clone()));
        }
    }
    Ok(None)
}
