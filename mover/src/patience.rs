//! Trying again within a patience: pauses of 100 ms, doubling up to 2 s, until a deadline. The
//! fence changes wait this way for checked transactions, and moves for their directory.

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
}
