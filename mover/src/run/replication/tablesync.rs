//! Tables whose initial copy PostgreSQL can no longer finish. A tablesync worker drops its slot on
//! the publisher before it commits the table's `SYNCDONE` on the subscriber; a subscriber that
//! stops in between comes back with the table copied (`f`, FINISHEDCOPY) and its slot gone, and
//! retries the catch-up from that slot forever ("replication slot ... does not exist"). Only a
//! copy made again gets the table back, so the mover looks for this while it waits for the copy.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::error::{At, Error, Step};

/// How long a copied table's slot must stay missing before it counts as lost: the tablesync
/// worker commits `SYNCDONE` moments after it drops the slot, so a look in between is not one.
const LOST_AFTER: Duration = Duration::from_secs(3);

/// Copied tables of a subscription, each seen without its tablesync slot since when.
#[derive(Default)]
pub(crate) struct LostSlots {
    missing_since: HashMap<String, Instant>,
}

impl LostSlots {
    /// The subscription's tables (on `target`) whose tablesync slot has been missing from
    /// `source` for [`LOST_AFTER`].
    pub(crate) async fn look(
        &mut self,
        (source, source_name): (&Client, &str),
        (target, target_name): (&Client, &str),
        subscription: &str,
        step: Step,
    ) -> Result<Vec<String>, Error> {
        let copied = copied_tables(target, subscription)
            .await
            .at(step, target_name)?;
        let slots: Vec<&str> = copied.iter().map(|(_, slot)| slot.as_str()).collect();
        let missing = if slots.is_empty() {
            Vec::new()
        } else {
            missing_slots(source, &slots).await.at(step, source_name)?
        };
        let now = Instant::now();
        let missing: Vec<&String> = copied
            .iter()
            .filter(|(_, slot)| missing.contains(slot))
            .map(|(table, _)| table)
            .collect();
        self.missing_since
            .retain(|table, _| missing.contains(&table));
        Ok(missing
            .into_iter()
            .filter(|table| {
                let since = *self.missing_since.entry((*table).clone()).or_insert(now);
                now.duration_since(since) >= LOST_AFTER
            })
            .cloned()
            .collect())
    }

    /// Whether a copied table's slot was seen missing, not yet for [`LOST_AFTER`]: its
    /// subscription, which PostgreSQL may have disabled over the table's errors, is left as it
    /// is until that is decided.
    pub(crate) fn suspects(&self) -> bool {
        !self.missing_since.is_empty()
    }
}

/// `(table, its tablesync slot's name)` for each table of the subscription copied but not yet
/// caught up (`f`). The slot's name is PostgreSQL's: `pg_<subscription>_sync_<table>_<the
/// subscriber's system identifier>`.
async fn copied_tables(
    target: &Client,
    subscription: &str,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = target
        .query(
            "SELECT format('%s.%s', n.nspname, c.relname),
                    format('pg_%s_sync_%s_%s', s.oid, r.srrelid,
                           (SELECT system_identifier FROM pg_control_system()))
             FROM pg_subscription s
             JOIN pg_subscription_rel r ON r.srsubid = s.oid
             JOIN pg_class c ON c.oid = r.srrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE s.subname = $1 AND r.srsubstate = 'f'
               AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY 1",
            &[&subscription],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Those of `slots` the source does not have.
async fn missing_slots(
    source: &Client,
    slots: &[&str],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = source
        .query(
            "SELECT name FROM unnest($1::text[]) name \
             WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = name)",
            &[&slots],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
