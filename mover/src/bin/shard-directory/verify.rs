//! Reconciling without moving (`verify`): rows on a shard the directory does not name, and one
//! entity's rows compared between two shards. Exit 5 when something is found.

use serde_json::json;
use shard_directory_mover::{Error, Mover};
use shard_directory_protocol::EntityKey;

use crate::output::{lines, Outcome, Print};

/// `verify shard`: the entities with rows on `shard` that the directory places elsewhere.
pub async fn shard(
    mover: &Mover,
    print: Print,
    shard: &str,
    entity_type: Option<&str>,
) -> Result<(), Outcome> {
    let strays = mover.strays(shard, entity_type).await?;
    print.result(&strays, |strays| {
        if strays.is_empty() {
            return format!("every row on {shard} is where the directory says");
        }
        lines(strays.iter().map(|stray| {
            let rows: Vec<String> = stray
                .rows
                .iter()
                .map(|(t, n)| format!("{t}: {n}"))
                .collect();
            format!(
                "{} has rows on {} ({}), fenced {} there; the directory {}",
                stray.entity,
                stray.shard,
                rows.join(", "),
                stray.fence,
                match &stray.placement {
                    Some(p) => format!("places it on {} ({})", p.shard_name, p.state),
                    None => "has no entry for it".to_owned(),
                }
            )
        }))
    });
    if strays.is_empty() {
        return Ok(());
    }
    Err(Outcome::Failed(
        5,
        format!(
            "{} entities with rows out of place on {shard}",
            strays.len()
        ),
    ))
}

/// `verify entity`: `key`'s rows on the shard the directory names, compared with `against`'s.
pub async fn entity(
    mover: &Mover,
    print: Print,
    key: &EntityKey,
    against: &str,
) -> Result<(), Outcome> {
    let counts = match mover.compare(key, against).await {
        Ok(counts) => counts,
        Err(e @ Error::Mismatch { .. }) => return Err(Outcome::Failed(5, e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let same = json!({"entity_type": key.entity_type, "entity_id": key.entity_id,
                      "against": against, "rows": counts});
    print.result(&same, |_| {
        let rows: Vec<String> = counts.iter().map(|(t, n)| format!("{t}: {n}")).collect();
        format!("{key}: the same rows on {against} ({})", rows.join(", "))
    });
    Ok(())
}
