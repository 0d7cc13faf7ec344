//! How fast a table's rows are being copied (or deleted) and when that will be done, measured by
//! the run from its own reports and kept with the table's progress, so that `status` (and
//! `status --json`) shows it while the move runs.

use std::collections::HashMap;
use std::time::Instant;

/// Since when, and from how many rows done, each table is being measured.
#[derive(Default)]
pub(crate) struct Rates(HashMap<String, (Instant, i64)>);

impl Rates {
    /// `done` of `total` rows of `table` at `now`: rows per second and seconds left, once a
    /// second has passed since the table's first report and rows have moved. A count that went
    /// down (the delete after the copy) starts the measure again.
    pub fn update(
        &mut self,
        table: &str,
        (done, total): (i64, i64),
        now: Instant,
    ) -> (Option<i64>, Option<i64>) {
        let (since, from) = *self
            .0
            .entry(table.to_owned())
            .and_modify(|(at, from)| {
                if done < *from {
                    (*at, *from) = (now, done);
                }
            })
            .or_insert((now, done));
        let seconds = now.saturating_duration_since(since).as_secs_f64();
        if seconds < 1.0 || done <= from {
            return (None, None);
        }
        let rate = (done - from) as f64 / seconds;
        let left = (total - done).max(0) as f64 / rate;
        (Some(rate.round() as i64), Some(left.ceil() as i64))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_rate_is_rows_since_the_first_report_and_the_eta_what_is_left_at_that_rate() {
        let (mut rates, t0) = (Rates::default(), Instant::now());
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(rates.update("t", (100, 10_000), t0), (None, None));
        assert_eq!(rates.update("t", (600, 10_000), at(500)), (None, None));
        // 1,900 rows in 2 s: 950 rows/s, 8,000 left: 9 s
        assert_eq!(
            rates.update("t", (2_000, 10_000), at(2_000)),
            (Some(950), Some(9))
        );
        // the delete starts from 0: measured afresh
        assert_eq!(rates.update("t", (0, 10_000), at(3_000)), (None, None));
        assert_eq!(
            rates.update("t", (5_000, 10_000), at(5_000)),
            (Some(2_500), Some(2))
        );
        assert_eq!(rates.update("u", (7, 7), at(5_000)), (None, None));
    }
}
