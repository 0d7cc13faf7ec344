//! How a move is made: the method, the freeze budget, what is kept, how long each wait lasts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::run::cleanup::throttle::Throttle;

/// Which method to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MethodChoice {
    /// `logical` when the source has `wal_level = logical`, else `copy`.
    #[default]
    Auto,
    Logical,
    Copy,
}

#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub method: MethodChoice,
    /// Longest time the entity's writes may be refused; past it the move aborts itself.
    pub max_freeze: Duration,
    /// Method logical: compare every row while the entity is still writable and, under the
    /// freeze, only the rows changed since, so the freeze does not grow with the entity. Off, the
    /// freeze compares every row (needs no slot or publication on the target).
    pub online_check: bool,
    /// How many freezes a logical move makes when one runs past `max_freeze`: each is undone
    /// (the entity writable again, its copy kept) and the move catches up and freezes again;
    /// past the last, it aborts.
    pub freeze_attempts: u32,
    /// Leave the entity's rows on the source (fenced `moved`, so nobody reads or writes them).
    pub keep_source: bool,
    /// After the cutover, replicate the entity's rows back to the source (kept there, fenced
    /// `moved`), so that `revert` moves it back with only a freeze; `finalize` ends that.
    pub reversible: bool,
    /// How long a reversible move stays so: past it, `finalize --expired` finalizes it.
    pub reversible_for: Option<Duration>,
    /// Longest time the initial copy, and the catch-up before the freeze, may take. Past it the
    /// move stops, resumable; the entity stays writable throughout. A copy paced by `max_rate`
    /// or `max_lag` takes as long as its pace needs.
    pub sync_timeout: Duration,
    /// Rows deleted per transaction when clearing a shard of the entity's rows.
    pub delete_batch: i64,
    /// At most this many rows a second: copied by the logical method's initial copy (then the
    /// mover's own, `initial_copy`), and deleted when clearing a shard of the entity's rows (the
    /// source's after the cutover, the target's on an abort).
    pub max_rate: Option<u64>,
    /// While the written shard's standbys are more than this many bytes behind in replay, that
    /// copy or delete waits (their positions are visible with `pg_read_all_stats`).
    pub max_lag: Option<i64>,
    /// Tables (`schema.table`) with a column named like the entity's key column that does not
    /// hold entity ids: preflight otherwise refuses a table it cannot tell from an unprotected
    /// table of the entity.
    pub unrelated_tables: Vec<String>,
    /// How long a fence change (or the replication slot's creation) may keep waiting behind a
    /// shard's transactions in flight before the step gives up: each try waits
    /// `shard_directory.fence_wait_timeout`, then the fence is tried again.
    pub fence_patience: Duration,
    /// WAL the move's replication slot may keep on the source (bytes); past it the move is
    /// undone, before the source's disk fills for every tenant of the shard.
    pub max_slot_lag: i64,
    /// How much longer than `max_freeze` a freeze's lease runs. The mover ends a freeze itself
    /// by `max_freeze`; the lease ends one whose mover vanished (the shard admits the entity's
    /// clients again, and routers release it in the directory), and a mover that was only slow
    /// finds it ended and does not cut over.
    pub lease_grace: Duration,
    /// How old the entities' sizes a plan of many moves reads from the directory
    /// (`shard_sizes`) may be; older ones are measured again on the shard (`ZERO`: always).
    pub sizes_max_age: Duration,
    /// How long a move whose directory stopped answering (its server crashed, or failed over to
    /// a standby that a multi-host conninfo finds) keeps trying to reach it again, then goes on
    /// from its record; `ZERO`: it stops at once, resumable. A batch's runner waits as long.
    pub directory_patience: Duration,
}

impl MoveOptions {
    /// How a shard is cleared of the entity's rows.
    pub(crate) fn throttle(&self) -> Throttle {
        Throttle::new(self.delete_batch, self.max_rate, self.max_lag)
    }

    /// These options with what `choices` says each move is made with.
    pub(crate) fn with(&self, choices: MoveChoices) -> MoveOptions {
        MoveOptions {
            method: choices.method,
            max_freeze: Duration::from_millis(choices.max_freeze_ms),
            online_check: choices.online_check,
            freeze_attempts: choices.freeze_attempts,
            keep_source: choices.keep_source,
            reversible: choices.reversible,
            reversible_for: choices.reversible_for_ms.map(Duration::from_millis),
            unrelated_tables: choices.unrelated_tables,
            ..self.clone()
        }
    }
}

/// What each move of a batch is made with (`shard_move_batches.move_options`), kept so that a
/// batch resumed later starts the rest of its moves as it began them; how long steps wait and
/// how fast deletes go stay the resuming command's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveChoices {
    pub method: MethodChoice,
    pub max_freeze_ms: u64,
    pub online_check: bool,
    pub freeze_attempts: u32,
    pub keep_source: bool,
    pub reversible: bool,
    pub reversible_for_ms: Option<u64>,
    pub unrelated_tables: Vec<String>,
}

impl From<&MoveOptions> for MoveChoices {
    fn from(o: &MoveOptions) -> MoveChoices {
        MoveChoices {
            method: o.method,
            max_freeze_ms: o.max_freeze.as_millis() as u64,
            online_check: o.online_check,
            freeze_attempts: o.freeze_attempts,
            keep_source: o.keep_source,
            reversible: o.reversible,
            reversible_for_ms: o.reversible_for.map(|d| d.as_millis() as u64),
            unrelated_tables: o.unrelated_tables.clone(),
        }
    }
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            method: MethodChoice::Auto,
            max_freeze: Duration::from_secs(10),
            online_check: true,
            freeze_attempts: 3,
            keep_source: false,
            reversible: false,
            reversible_for: None,
            sync_timeout: Duration::from_secs(30 * 60),
            delete_batch: 10_000,
            max_rate: None,
            max_lag: None,
            unrelated_tables: Vec::new(),
            fence_patience: Duration::from_secs(60),
            max_slot_lag: 1 << 30,
            lease_grace: Duration::from_secs(10),
            sizes_max_age: Duration::from_secs(10 * 60),
            directory_patience: Duration::from_secs(60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batchs_choices_read_back_as_the_options_they_were_taken_from() {
        let chosen = MoveOptions {
            method: MethodChoice::Copy,
            max_freeze: Duration::from_millis(2500),
            online_check: false,
            freeze_attempts: 5,
            keep_source: true,
            reversible_for: Some(Duration::from_secs(3600)),
            unrelated_tables: vec!["audit.log".into()],
            ..MoveOptions::default()
        };
        let json = serde_json::to_string(&MoveChoices::from(&chosen)).unwrap();
        let resuming = MoveOptions {
            max_rate: Some(100),
            ..MoveOptions::default()
        };
        let made = resuming.with(serde_json::from_str(&json).unwrap());
        assert_eq!(MoveChoices::from(&made), MoveChoices::from(&chosen));
        assert_eq!(made.max_rate, Some(100), "the resuming command's pace");
    }
}
