//! Deleting an entity's rows from one shard, through the fence bypass: from the source once the
//! target owns the entity, from the target when a move is aborted. Children before the tables
//! they reference, so no foreign key among the entity's tables is violated or cascades.
//!
//! Most tables are cleared in batches. Two kinds are cleared in one transaction: a table that
//! references itself (a batch could remove a row that rows of a later batch still reference),
//! and a table another entity's rows could reference (`integrity::crossings`): its rows of the
//! entity are locked first, so no new reference to them can commit, then the delete goes ahead
//! only if no other entity's row references them. The mover never deletes, by cascade or
//! otherwise, a row that is not the entity's.

use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::preflight::integrity;
use crate::run::cleanup::throttle::Throttle;
use crate::shards::catalog::EntityTable;
use crate::shards::fence;

/// Deletes every row of the entity in `tables` (given parents first), `throttle.batch` rows per
/// transaction where that is safe, paced by `throttle`; calls `deleted(table, rows so far)` after
/// each transaction. With `replica`, as `session_replication_role = replica` (`triggers`): rows
/// the mover wrote without firing the shard's triggers are taken away without firing them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn delete_rows(
    (client, shard): (&mut Client, &str),
    tables: &[EntityTable],
    key: &EntityKey,
    version: i64,
    throttle: &mut Throttle,
    step: Step,
    replica: bool,
    mut deleted: impl FnMut(&str, u64),
) -> Result<(), Error> {
    let role = if replica {
        "SELECT set_config('session_replication_role', 'replica', true)"
    } else {
        "SELECT 1"
    };
    let crossings = integrity::crossings(tables);
    for t in tables.iter().rev() {
        let at = || Place::Table {
            shard: shard.to_owned(),
            table: t.name.clone(),
        };
        let predicate = t.entity_predicate();
        let guards: Vec<_> = crossings.iter().filter(|c| c.to.name == t.name).collect();
        if t.references_itself() || !guards.is_empty() {
            let tx = client.transaction().await.at(step, at())?;
            fence::bypass(&tx, key, version).await.at(step, at())?;
            tx.execute(role, &[]).await.at(step, at())?;
            if !guards.is_empty() {
                tx.execute(
                    &format!("SELECT 1 FROM {} WHERE {predicate} FOR UPDATE", t.quoted),
                    &[&key.entity_id],
                )
                .await
                .at(step, at())?;
            }
            for c in guards {
                let rows = tx
                    .query(&integrity::referencing_sql(c), &[&key.entity_id])
                    .await
                    .at(step, at())?;
                if !rows.is_empty() {
                    let rows = rows.iter().map(|r| r.get(0)).collect();
                    return Err(integrity::crossing_error(c, key, rows));
                }
            }
            let n = tx
                .execute(
                    &format!("DELETE FROM {} WHERE {predicate}", t.quoted),
                    &[&key.entity_id],
                )
                .await
                .at(step, at())?;
            point!("purge.whole.{:?}", step);
            tx.commit().await.at(step, at())?;
            deleted(&t.name, n);
            throttle.after(client, n).await.at(step, at())?;
            continue;
        }
        // The predicate is repeated outside the ctid list: on a partitioned table a ctid names a
        // row in each partition.
        let sql = format!(
            "DELETE FROM {table} WHERE {predicate} \
             AND ctid = ANY (ARRAY(SELECT ctid FROM {table} WHERE {predicate} LIMIT $2))",
            table = t.quoted
        );
        let mut total = 0;
        loop {
            let tx = client.transaction().await.at(step, at())?;
            fence::bypass(&tx, key, version).await.at(step, at())?;
            tx.execute(role, &[]).await.at(step, at())?;
            let n = tx
                .execute(&sql, &[&key.entity_id, &throttle.batch])
                .await
                .at(step, at())?;
            point!("purge.batch.{:?}", step);
            tx.commit().await.at(step, at())?;
            if n == 0 {
                break;
            }
            total += n;
            deleted(&t.name, total);
            throttle.after(client, n).await.at(step, at())?;
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
