//! Sequences do not travel with logical replication or a copy: before the target owns the entity,
//! every sequence the entity's tables draw from (serial and identity columns' own, and any other a
//! column default calls `nextval` on) is advanced on the target past its value on the source, so
//! new rows of the entity there cannot take a key its copied rows already hold. The target's
//! extension does it (`advance_sequence`): locked against `nextval`, and never backwards.

use std::collections::BTreeSet;

use tokio_postgres::Client;

use crate::catalog::EntityTable;
use crate::error::{At, Error, Step};

/// Every sequence of `tables`, once each.
pub(crate) fn of(tables: &[EntityTable]) -> BTreeSet<&str> {
    tables
        .iter()
        .flat_map(|t| t.sequences.iter().map(String::as_str))
        .collect()
}

/// Refuses, naming the sequence, when the target lacks one of the sources's sequences, or caches
/// values per session (`CACHE` above 1): a session there may hold values below the moved rows'
/// keys, fetched before the sequence was advanced, and hand them out after.
pub(crate) async fn check_target(
    target: &Client,
    shard: &str,
    tables: &[EntityTable],
) -> Result<(), Error> {
    for seq in of(tables) {
        let cache: Option<i64> = target
            .query_one(
                "SELECT (SELECT seqcache FROM pg_sequence WHERE seqrelid = to_regclass($1))",
                &[&seq],
            )
            .await
            .at(Step::Preflight, shard)?
            .get(0);
        let problem = match cache {
            None => format!("sequence {seq} is missing on target shard {shard}"),
            Some(cache) if cache > 1 => format!(
                "sequence {seq} on target shard {shard} caches {cache} values per session: one \
                 may hand out values fetched before the move advanced it, which moved rows hold"
            ),
            Some(_) => continue,
        };
        return Err(Error::Preflight {
            problem,
            fix: format!(
                "create it on shard {shard} as on the source, with CACHE 1 (ALTER SEQUENCE {seq} CACHE 1)"
            ),
        });
    }
    Ok(())
}

pub(crate) async fn advance(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    tables: &[EntityTable],
) -> Result<(), Error> {
    for seq in of(tables) {
        let last: Option<i64> = source
            .query_one("SELECT pg_sequence_last_value($1::text::regclass)", &[&seq])
            .await
            .at(Step::Sequences, source_name)?
            .get(0);
        let Some(last) = last else { continue };
        target
            .execute(
                "SELECT shard_directory.advance_sequence($1::text::regclass, $2)",
                &[&seq, &last],
            )
            .await
            .at(Step::Sequences, target_name)?;
    }
    Ok(())
}
