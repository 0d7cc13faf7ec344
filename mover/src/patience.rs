//! Trying again within a patience: pauses of 100 ms, doubling up to 2 s, until a deadline. The
//! fence changes wait this way for checked transactions, and moves and batches for their
//! directory.

use std::time::Duration;

// tokio's clock: the same as std's, except in a test that pauses it.
use tokio::time::Instant;

pub(crate) struct Patience {
    deadline: Instant,
    pause: Duration,
}

impl Patience {
    pub fn new(patience: Duration) -> Patience {
        Patience {
            deadline: Instant::now() + patience,
            pause: Duration::from_millis(100),
        }
    }

    /// Whether the next pause ends before the deadline.
    pub fn fits(&self) -> bool {
        Instant::now() + self.pause < self.deadline
    }

    /// Sleeps the next pause, cut at the deadline; false (without sleeping) once it has passed.
    pub async fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.pause.min(self.deadline - now)).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        true
    }
}

/// Runs `attempt` until it succeeds or fails with an error `passing` does not accept; a passing
/// error is tried again after a pause, for up to `patience` from the first one, and then returned.
pub(crate) async fn retry<T, E>(
    patience: Duration,
    passing: impl Fn(&E) -> bool,
    mut attempt: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut waiting: Option<Patience> = None;
    loop {
        let error = match attempt().await {
            Err(e) if passing(&e) => e,
            done => return done,
        };
        let waiting = waiting.get_or_insert_with(|| Patience::new(patience));
        if !waiting.pause().await {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_two_seconds_and_stop_at_the_deadline() {
        let mut p = Patience::new(Duration::from_millis(5_000));
        let started = tokio::time::Instant::now();
        let mut slept = Vec::new();
        loop {
            let before = tokio::time::Instant::now();
            if !p.pause().await {
                break;
            }
            slept.push((tokio::time::Instant::now() - before).as_millis());
        }
        // 100, 200, 400, 800, 1600, then what is left of the 5 s.
        assert_eq!(slept, [100, 200, 400, 800, 1600, 1900]);
        assert_eq!((tokio::time::Instant::now() - started).as_millis(), 5_000);
        assert!(!Patience::new(Duration::from_millis(100)).fits());
        assert!(Patience::new(Duration::from_millis(101)).fits());
    }

    #[tokio::test(start_paused = true)]
    async fn retry_tries_again_while_passing_and_for_the_patience_from_the_first_failure() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        // Fails twice passing, then succeeds.
        let done: Result<u32, &str> = retry(
            Duration::from_secs(1),
            |e| *e == "lost",
            async || {
                tries += 1;
                if tries < 3 {
                    Err("lost")
                } else {
                    Ok(tries)
                }
            },
        )
        .await;
        assert_eq!(done, Ok(3));
        assert_eq!((tokio::time::Instant::now() - started).as_millis(), 300);
        // Another error is returned at once.
        let other: Result<(), &str> = retry(
            Duration::from_secs(1),
            |e| *e == "lost",
            async || Err("other"),
        )
        .await;
        assert_eq!(other, Err("other"));
        // The patience counts from the first failure, not from the call.
        let started = tokio::time::Instant::now();
        let mut first = true;
        let given_up: Result<(), &str> = retry(
            Duration::from_secs(1),
            |_| true,
            async || {
                if std::mem::replace(&mut first, false) {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err("lost")
            },
        )
        .await;
        assert_eq!(given_up, Err("lost"));
        assert_eq!((tokio::time::Instant::now() - started).as_millis(), 6_000);
    }
}
