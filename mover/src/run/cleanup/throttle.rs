//! Pacing a move's long writes so that they do not hurt the other tenants of their shards: the
//! source's delete after the cutover, and the logical method's initial copy when a pace is asked
//! for (`initial_copy`): at most `--max-rate` rows a second, and waiting while the written
//! shard's standbys are more than `--max-lag` bytes behind in replay. (The copy method copies
//! under the freeze, where pacing would only lengthen it: it is not paced.)

use std::time::{Duration, Instant};

use tokio_postgres::Client;

/// The replay lag of the shard's standbys, in bytes (the largest). Without `pg_read_all_stats`
/// the mover does not see their positions and reads 0.
const STANDBY_LAG: &str =
    "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::int8 \
     FROM pg_stat_replication";

/// How often a paused delete looks at the lag again.
const LAG_POLL: Duration = Duration::from_millis(250);

/// When `rows` rows are due after the start at `rate` rows a second, the time spent waiting for
/// standbys added.
fn due(rows: u64, rate: u64, waited: Duration) -> Duration {
    Duration::from_secs_f64(rows as f64 / rate as f64) + waited
}

pub(crate) struct Throttle {
    /// Rows deleted per transaction.
    pub batch: i64,
    max_rate: Option<u64>,
    max_lag: Option<i64>,
    started: Instant,
    rows: u64,
    /// Time spent waiting for standbys, not counted against the rate.
    waited: Duration,
}

impl Throttle {
    pub fn new(batch: i64, max_rate: Option<u64>, max_lag: Option<i64>) -> Throttle {
        Throttle {
            batch,
            max_rate,
            max_lag,
            started: Instant::now(),
            rows: 0,
            waited: Duration::ZERO,
        }
    }

    /// Whether there is a pace to keep.
    pub fn paces(&self) -> bool {
        self.max_rate.is_some() || self.max_lag.is_some()
    }

    /// Rows between two waits of a copy: a tenth of a second's worth at `max_rate`, at most
    /// `batch`.
    pub fn step(&self) -> u64 {
        let batch = self.batch.max(1) as u64;
        self.max_rate
            .filter(|r| *r > 0)
            .map_or(batch, |rate| (rate / 10).clamp(1, batch))
    }

    /// After `rows` more rows written on the shard `client` is connected to: sleeps until the
    /// rate since the start is within `max_rate`, then while the standbys lag over `max_lag`.
    /// Returns how long it slept.
    pub async fn after(
        &mut self,
        client: &Client,
        rows: u64,
    ) -> Result<Duration, tokio_postgres::Error> {
        self.rows += rows;
        let mut slept = Duration::ZERO;
        if let Some(rate) = self.max_rate.filter(|r| *r > 0) {
            let early = due(self.rows, rate, self.waited).saturating_sub(self.started.elapsed());
            tokio::time::sleep(early).await;
            slept += early;
        }
        if let Some(max_lag) = self.max_lag {
            let paused = Instant::now();
            while client.query_one(STANDBY_LAG, &[]).await?.get::<_, i64>(0) > max_lag {
                tokio::time::sleep(LAG_POLL).await;
            }
            self.waited += paused.elapsed();
            slept += paused.elapsed();
        }
        Ok(slept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_due_at_the_rate_after_the_start_and_the_waits() {
        assert_eq!(due(1_000, 500, Duration::ZERO), Duration::from_secs(2));
        assert_eq!(
            due(250, 500, Duration::from_secs(1)),
            Duration::from_millis(1_500)
        );
    }

    #[test]
    fn a_paced_copy_waits_every_tenth_of_a_second_of_rows_at_most_a_batch_apart() {
        let step = |rate| Throttle::new(10_000, rate, None).step();
        assert_eq!(step(Some(1_000)), 100);
        assert_eq!(step(Some(5)), 1);
        assert_eq!(step(Some(1_000_000)), 10_000);
        assert_eq!(step(None), 10_000);
        assert!(!Throttle::new(10_000, None, None).paces());
        assert!(Throttle::new(10_000, None, Some(1 << 20)).paces());
    }
}
