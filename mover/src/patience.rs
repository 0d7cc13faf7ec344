//! Trying again within a patience: pauses of 100 ms, doubling up to 2 s, until a deadline. The
//! one schedule ([`Retry`]) that fence changes wait in for checked transactions, moves and batches
//! for their directory, and an abort for the connections it lost.

use std::time::Duration;

// tokio's clock: the same as std's, except in a test that pauses it.
use tokio::time::Instant;

struct Patience {
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

    /// Whether the deadline has passed.
    pub fn spent(&self) -> bool {
        Instant::now() >= self.deadline
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

/// How long a [`Retry`] keeps trying.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub patience: Duration,
    /// The patience counts from the call (the first attempt's own time is in it), or else from
    /// the first failure.
    pub from_call: bool,
    /// Only pauses that end before the deadline, for an attempt that itself waits (a fence
    /// change behind its lock timeout); or else the last pause cut at the deadline.
    pub whole_pauses: bool,
}

/// What a failed attempt worth another try means to a [`Retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Tried again after a pause, within the patience already running.
    Again,
    /// A new trouble (another outage): tried again, the patience counting from now.
    Anew,
}

/// The one retry schedule every waiting caller keeps: after each failed attempt,
/// [`Retry::again`] says whether to try again, having paused. A caller's loop is then
///
/// ```text
/// let mut retry = Retry::new(wait);
/// loop {
///     let error = match attempt().await { Err(e) if worth_another(&e) => e, done => return done };
///     if !retry.again(Verdict::Again).await { return Err(error); }
/// }
/// ```
///
/// (a state, not a function taking the attempt as a closure: an attempt that borrows its caller
/// mutably, or a future that must stay `Send`, needs no closure tricks).
pub(crate) struct Retry {
    wait: Wait,
    patience: Option<Patience>,
}

impl Retry {
    pub fn new(wait: Wait) -> Retry {
        Retry {
            patience: wait.from_call.then(|| Patience::new(wait.patience)),
            wait,
        }
    }

    /// After an attempt that failed as `verdict` says (one worth another try: the caller returns
    /// any other error itself): false when the patience is spent (return the error then), else
    /// true once the next pause is over.
    pub async fn again(&mut self, verdict: Verdict) -> bool {
        if !self.retries(verdict) {
            return false;
        }
        self.pause().await;
        true
    }

    /// [`Retry::again`]'s decision alone, for a caller that says so before it pauses.
    pub fn retries(&mut self, verdict: Verdict) -> bool {
        let patience = self.wait.patience;
        let waiting = match verdict {
            Verdict::Again => self.patience.get_or_insert_with(|| Patience::new(patience)),
            Verdict::Anew => self.patience.insert(Patience::new(patience)),
        };
        if self.wait.whole_pauses {
            waiting.fits()
        } else {
            !waiting.spent()
        }
    }

    /// The next pause, after [`Retry::retries`] said yes.
    pub async fn pause(&mut self) {
        if let Some(waiting) = &mut self.patience {
            waiting.pause().await;
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

    /// The loop every caller writes, for the tests.
    async fn retry<T, E: Copy>(
        wait: Wait,
        judge: impl Fn(&E) -> Option<Verdict>,
        mut attempt: impl AsyncFnMut(Option<E>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut retry = Retry::new(wait);
        let mut last = None;
        loop {
            let error = match attempt(last).await {
                Err(e) => e,
                done => return done,
            };
            match judge(&error) {
                Some(verdict) if retry.again(verdict).await => {}
                _ => return Err(error),
            }
            last = Some(error);
        }
    }

    fn lost(e: &&str) -> Option<Verdict> {
        (*e == "lost").then_some(Verdict::Again)
    }

    const FROM_FIRST_FAILURE: Wait = Wait {
        patience: Duration::from_secs(1),
        from_call: false,
        whole_pauses: false,
    };

    #[tokio::test(start_paused = true)]
    async fn retry_tries_again_while_passing_and_for_the_patience_from_the_first_failure() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        // Fails twice passing, then succeeds; each attempt sees the error before it.
        let mut seen = Vec::new();
        let done: Result<u32, &str> = retry(FROM_FIRST_FAILURE, lost, async |last| {
            seen.push(last);
            tries += 1;
            if tries < 3 {
                Err("lost")
            } else {
                Ok(tries)
            }
        })
        .await;
        assert_eq!(done, Ok(3));
        assert_eq!(seen, [None, Some("lost"), Some("lost")]);
        assert_eq!((tokio::time::Instant::now() - started).as_millis(), 300);
        // Another error is returned at once.
        let other: Result<(), &str> = retry(FROM_FIRST_FAILURE, lost, async |_| Err("other")).await;
        assert_eq!(other, Err("other"));
        // The patience counts from the first failure, not from the call.
        let slow_first = Duration::from_secs(5);
        assert_eq!(given_up_after(FROM_FIRST_FAILURE, slow_first).await, 6_000);
    }

    /// Milliseconds until `retry` gives up on attempts that always fail passing, the first
    /// taking `first` to.
    async fn given_up_after(wait: Wait, first: Duration) -> u128 {
        let started = tokio::time::Instant::now();
        let mut slow = Some(first);
        let given_up: Result<(), &str> = retry(wait, lost, async |_| {
            if let Some(first) = slow.take() {
                tokio::time::sleep(first).await;
            }
            Err("lost")
        })
        .await;
        assert_eq!(given_up, Err("lost"));
        (tokio::time::Instant::now() - started).as_millis()
    }

    #[tokio::test(start_paused = true)]
    async fn retry_from_the_call_with_whole_pauses_and_anew_for_a_new_trouble() {
        // From the call: a first attempt of 700 ms leaves 300 ms, whole pauses only: the 100 ms
        // pause fits, the 200 ms one after it would end at the deadline, not before it.
        let wait = Wait {
            patience: Duration::from_secs(1),
            from_call: true,
            whole_pauses: true,
        };
        assert_eq!(given_up_after(wait, Duration::from_millis(700)).await, 800);
        // Anew: each new trouble gets the whole patience again.
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let anew: Result<(), u32> = retry(
            FROM_FIRST_FAILURE,
            |e| Some([Verdict::Again, Verdict::Anew][usize::from(*e % 5 == 0)]),
            async |_| {
                tries += 1;
                Err(tries)
            },
        )
        .await;
        // 100, 200, 400 and what is left of 1 s (300); the fifth failure is a new trouble with
        // a whole second of its own; the ninth finds it spent.
        assert_eq!(anew, Err(9));
        assert_eq!((tokio::time::Instant::now() - started).as_millis(), 2_000);
    }
}
