//! How long a move of each entity is expected to freeze, for plans that keep every move within
//! `--max-freeze`. A logical move with the online check freezes for a catch-up and the rows
//! changed since that check, whatever the entity's size (and measures it before freezing), so
//! it needs no estimate. Otherwise (the copy method, or `--no-online-check`) the freeze grows with
//! the entity's rows: it costs, per row, what the shard's finished copy moves froze for per row
//! (its history in `shard_moves`, the last [`HISTORY`] of them), or, with no history, what
//! comparing a row takes on both shards (a sample of the shard's largest entity hashed), which a
//! copy's copy adds to: then the estimate is a floor.

use std::time::Duration;

use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::error::{At, Error, Place, Step};
use crate::options::{MethodChoice, MoveOptions};
use crate::run::checks::verify;
use crate::shards::catalog::EntityTable;

/// Finished copy moves from a shard whose freezes are the shard's history.
const HISTORY: i64 = 20;

/// Freeze per row of a move from `shard`, when the freeze grows with the entity. `largest` is
/// the shard's entity with the most rows, sampled when the shard has no history.
pub(crate) async fn per_row(
    directory: &Client,
    (client, shard): (&Client, &str),
    tables: &[EntityTable],
    options: &MoveOptions,
    largest: Option<&EntityKey>,
) -> Result<Option<Duration>, Error> {
    let logical = options.method != MethodChoice::Copy
        && crate::preflight::logical_blocker((client, shard), tables)
            .await?
            .is_none();
    if logical && options.online_check {
        return Ok(None);
    }
    if !logical {
        if let Some(per_row) = history(directory, shard).await? {
            return Ok(Some(per_row));
        }
    }
    let Some(key) = largest else { return Ok(None) };
    // Each row is compared on both shards.
    let compared = verify::per_row((client, shard), tables, key).await?;
    Ok(compared.map(|d| d * 2))
}

/// What the last finished copy moves from `shard` froze for per row, if there were any.
async fn history(directory: &Client, shard: &str) -> Result<Option<Duration>, Error> {
    let seconds: Option<f64> = directory
        .query_one(
            "SELECT sum(extract(epoch FROM max_freeze_seen))::float8 / nullif(sum(rows), 0) \
             FROM (SELECT m.max_freeze_seen, \
                          (SELECT sum((p.value->>'rows')::int8) FROM jsonb_each(m.tables) p) AS rows \
                     FROM shard_directory.shard_moves m \
                    WHERE m.source_shard = $1 AND m.method = 'copy' AND m.phase = 'done' \
                      AND m.max_freeze_seen IS NOT NULL \
                    ORDER BY m.move_id DESC LIMIT $2) h",
            &[&shard, &HISTORY],
        )
        .await
        .at(Step::Plan, Place::Directory)?
        .get(0);
    Ok(seconds.map(Duration::from_secs_f64))
}
