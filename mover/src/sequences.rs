//! Sequences do not travel with logical replication or a copy: before the target owns the entity,
//! each sequence-backed column's sequence there is advanced past the source's, so new rows of
//! the entity on the target cannot take a key its copied rows already hold.

use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::error::{At, Error, Place, Step};

pub(crate) async fn advance(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    tables: &[EntityTable],
) -> Result<(), Error> {
    for t in tables {
        let at = |shard: &str| Place::Table {
            shard: shard.to_owned(),
            table: t.name.clone(),
        };
        for column in &t.sequence_columns {
            let last: Option<i64> = source
                .query_one(
                    "SELECT pg_sequence_last_value(pg_get_serial_sequence($1, $2)::regclass)",
                    &[&t.quoted, column],
                )
                .await
                .at(Step::Sequences, at(source_name))?
                .get(0);
            let Some(last) = last else { continue };
            // Never backwards: the target's own rows may be further along.
            target
                .execute(
                    "SELECT setval(s, $3) FROM (SELECT pg_get_serial_sequence($1, $2)::regclass AS s) q \
                     WHERE s IS NOT NULL AND coalesce(pg_sequence_last_value(s), 0) < $3",
                    &[&t.quoted, column, &last],
                )
                .await
                .at(Step::Sequences, at(target_name))?;
        }
    }
    Ok(())
}
