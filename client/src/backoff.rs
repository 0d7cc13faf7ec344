//! Exponential backoff with jitter, shared by the watcher's reconnects and the router's retries.

use std::time::Duration;

/// `base * 2^attempt`, capped at `max`, with full jitter on the upper half so that many
/// instances refused at once do not come back at once.
pub(crate) fn jittered(base: Duration, attempt: u32, max: Duration) -> Duration {
    let step = base.saturating_mul(1 << attempt.min(16)).min(max);
    step / 2 + step.mul_f64(fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_between_half_and_all_of_the_capped_step() {
        let (base, max) = (Duration::from_millis(10), Duration::from_millis(100));
        for attempt in 0..20 {
            let step = (base * 2u32.pow(attempt.min(16))).min(max);
            let d = jittered(base, attempt, max);
            assert!(d >= step / 2 && d <= step, "attempt {attempt}: {d:?}");
        }
    }
}
