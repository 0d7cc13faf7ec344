//! `cleanup`: replication objects left behind by finished or aborted moves, dropped.

use shard_directory_mover::Mover;

use crate::output::{lines, Outcome, Print};

pub async fn cleanup(mover: &Mover, print: Print) -> Result<(), Outcome> {
    let dropped = mover.cleanup().await?;
    print.result(&dropped, |dropped| {
        if dropped.is_empty() {
            "nothing to clean up".to_owned()
        } else {
            lines(dropped.iter().map(|d| format!("dropped {d}")))
        }
    });
    Ok(())
}
