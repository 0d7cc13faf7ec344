//! The decisions of a routed transaction, without its connections: where each attempt goes and
//! with which version, how long it has, how long a write waits out a freeze, and what a shard's
//! refusal teaches (follow `moved_to`, re-read the directory, back off, or give up). [`Router`]
//! runs its attempts on its own pools through it; an application that owns its connections (the
//! Python package, on psycopg) runs them on its own and asks it the same questions, so that
//! every client makes the same decisions (docs/protocol.md, §8-§10).
//!
//! [`Router`]: crate::Router

use std::time::{Duration, Instant};

use crate::directory::Directory;
use crate::entry::{EntityKey, Entry, State};
use crate::error::{Error, Result};
use crate::policy::Cached;
use crate::rejection::Rejection;
use crate::router::RetryPolicy;

/// One routed transaction's attempts, from the first to the last.
///
/// ```no_run
/// # async fn demo(directory: shard_directory_client::Directory) -> shard_directory_client::Result<()> {
/// use shard_directory_client::{EntityKey, RetryPolicy, Routing, Verdict};
///
/// let mut routing = Routing::new(&directory, EntityKey::new("tenant", "8842"), RetryPolicy::default(), true);
/// loop {
///     let route = routing.next().await?;
///     // BEGIN on route.entry.shard_name's connection, then the stamp (`Routing::stamp`) with
///     // route.version, the statements, COMMIT, all within route.time_left. On a 40001:
///     # let refusal = shard_directory_client::Rejection::Frozen;
///     match routing.refused(&route, &refusal, |_shard| true).await? {
///         Verdict::Retry => continue,
///         Verdict::GiveUp => break,
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Routing {
    directory: Directory,
    key: EntityKey,
    policy: RetryPolicy,
    /// A write that is not read-only: it waits while the entity is `read_only`.
    waits_out_freeze: bool,
    started: Instant,
    attempt: u32,
}

/// Where an attempt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Route {
    /// The entity's entry: its shard (and, while `migrating`, its target).
    pub entry: Entry,
    /// The directory version the attempt is stamped with.
    pub version: i64,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// How long the attempt may take, the wait for a connection included: its statements are
    /// bounded by it ([`Routing::stamp`] sets `statement_timeout`).
    pub time_left: Duration,
}

/// What to do after a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The route was repaired (and the backoff waited): run the transaction again.
    Retry,
    /// No re-run cures it, or the deadline is past: return the refusal to the caller.
    GiveUp,
}

/// What an attempt's stamp checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A write's: refused by a shard that does not own the entity, or while it is frozen.
    Write,
    /// A read's: a frozen entity passes (its source holds every row until the cutover).
    Read,
    /// None: the settings alone, for a read that accepts an answer from a shard that gave the
    /// entity away.
    Unchecked,
}

impl Routing {
    /// The attempts of one transaction for `key`, re-run within `policy`; `write`: a read-write
    /// transaction, which waits out a freeze instead of sending anything.
    pub fn new(directory: &Directory, key: EntityKey, policy: RetryPolicy, write: bool) -> Routing {
        Routing {
            directory: directory.clone(),
            key,
            policy,
            waits_out_freeze: write,
            started: Instant::now(),
            attempt: 0,
        }
    }

    /// The entity the attempts are routed for.
    pub fn key(&self) -> &EntityKey {
        &self.key
    }

    /// The stamp statement: the settings the shard's check reads (`$1` the version, `$2` the
    /// entity type, `$3` its id, `$4` the attempt's milliseconds left, all text), set for the
    /// transaction only, and the check itself, in one statement. Run it first in the
    /// transaction; [`Routing::stamp_params`] are its parameters.
    pub fn stamp(check: Check) -> &'static str {
        use crate::router::stamp;
        match check {
            Check::Write => &stamp::STAMP_AND_CHECK,
            Check::Read => &stamp::STAMP_AND_READ_CHECK,
            Check::Unchecked => &stamp::STAMP,
        }
    }

    /// The parameters of [`Routing::stamp`] for `route`.
    pub fn stamp_params(&self, route: &Route) -> [String; 4] {
        [
            route.version.to_string(),
            self.key.entity_type.clone(),
            self.key.entity_id.clone(),
            crate::router::stamp::left_ms(route.time_left),
        ]
    }

    /// What is left of the deadline.
    fn time_to_deadline(&self) -> Duration {
        self.policy.deadline.saturating_sub(self.started.elapsed())
    }

    fn out_of_time(&self, backoff: Duration) -> bool {
        self.started.elapsed() + backoff > self.policy.deadline
    }

    /// The next attempt's route. A write to an entity that is `read_only` sends nothing: it
    /// waits (with backoff, asking the directory once a second to release a freeze whose lease
    /// ended) until the freeze ends, and past the deadline fails with [`Error::ReadOnly`].
    pub async fn next(&mut self) -> Result<Route> {
        loop {
            self.attempt += 1;
            let (entry, version) = self.directory.route(&self.key).await?;
            if self.waits_out_freeze && entry.state == State::ReadOnly {
                // The whole deadline is waited, not given up a backoff early: the last
                // backoff is cut to what is left.
                let left = self.time_to_deadline();
                let backoff = self.policy.backoff(self.attempt).min(left);
                if left.is_zero() {
                    return Err(self.gave_up_on_the_freeze());
                }
                self.directory.counters().retried();
                // Not only the cached state: the cutover may have committed while this client
                // was not told (no LISTEN behind a pooler). And a freeze whose mover vanished
                // ends with its lease: the directory is asked to release it. Within the
                // deadline: a directory that does not answer would hold the write past it.
                let look = async {
                    if !self.directory.release_if_expired(&self.key).await {
                        tokio::time::sleep(backoff).await;
                        self.refresh_or_degrade(&entry).await?;
                    }
                    Ok::<_, Error>(())
                };
                match tokio::time::timeout(left, look).await {
                    Ok(looked) => looked?,
                    Err(_) => return Err(self.gave_up_on_the_freeze()),
                }
                continue;
            }
            let time_left = match self.attempt {
                1 => self.policy.attempt_timeout,
                _ => self.time_to_deadline().min(self.policy.attempt_timeout),
            };
            return Ok(Route {
                entry,
                version,
                attempt: self.attempt,
                time_left,
            });
        }
    }

    /// [`Error::ReadOnly`], logged: the deadline passed with the entity still frozen.
    fn gave_up_on_the_freeze(&self) -> Error {
        tracing::warn!(entity = %self.key, attempts = self.attempt, "gave up waiting for a cutover to end");
        Error::ReadOnly(self.key.clone())
    }

    /// The attempt at `route` was refused (a 40001 whose DETAIL is `rejection`): counts it,
    /// learns what it says (the `moved_to` of a shard `can_route_to` reaches, else the
    /// directory re-read), waits the backoff, and says whether to run the transaction again.
    /// [`Error::DirectoryBehind`] when the shard requires a version the directory has not
    /// reached; a directory outage during the repair is the outage policy's to decide.
    pub async fn refused(
        &mut self,
        route: &Route,
        rejection: &Rejection,
        can_route_to: impl Fn(&str) -> bool,
    ) -> Result<Verdict> {
        let counters = self.directory.counters();
        counters.rejected(rejection.reason());
        let (key, attempt) = (&self.key, route.attempt);
        tracing::debug!(entity = %key, %rejection, attempt, "shard refused the transaction");
        let backoff = self.policy.backoff(attempt);
        // Another entity's row, which lives elsewhere now: following its `moved_to` would
        // route this entity's next writes to a shard the directory does not name for it.
        if self.out_of_time(backoff)
            || matches!(rejection, Rejection::Other(_))
            || rejection.about_another(key)
        {
            tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
            return Ok(Verdict::GiveUp);
        }
        counters.retried();
        match rejection {
            Rejection::Moved {
                moved_to, version, ..
            } if can_route_to(moved_to) => {
                self.directory
                    .learn_moved(key, &route.entry, moved_to, *version);
                // The refusal said where to go: the first time, straight there.
                if attempt == 1 {
                    return Ok(Verdict::Retry);
                }
            }
            // A shard this client cannot reach (retired, or not learned yet): the directory
            // says where the entity is, not the refusal.
            Rejection::Moved { .. } | Rejection::Stale { .. } | Rejection::Missing => {
                let refresh = self.refresh_or_degrade(&route.entry);
                let Ok(refreshed) = tokio::time::timeout(self.time_to_deadline(), refresh).await
                else {
                    tracing::warn!(entity = %key, %rejection, attempts = attempt, "the directory did not answer by the deadline; giving up");
                    return Ok(Verdict::GiveUp);
                };
                let refreshed = refreshed?;
                // A minimum the directory has not reached: no refresh cures it (a failover that
                // lost the directory's last changes, a minimum raised by hand).
                if let (
                    true,
                    Rejection::Stale {
                        minimum: Some(minimum),
                    },
                ) = (refreshed, rejection)
                {
                    let (minimum, known) = (*minimum, self.directory.version());
                    if known < minimum {
                        return Err(Error::DirectoryBehind {
                            entity: key.clone(),
                            shard: route.entry.shard_name.to_string(),
                            minimum,
                            directory_version: known,
                        });
                    }
                }
            }
            Rejection::Frozen | Rejection::Serialization | Rejection::Other(_) => {}
        }
        // The refresh took its time: an attempt that could not end by the deadline is not
        // begun, and the refusal says why.
        if self.started.elapsed() + backoff >= self.policy.deadline {
            tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
            return Ok(Verdict::GiveUp);
        }
        tokio::time::sleep(backoff).await;
        Ok(Verdict::Retry)
    }

    /// Reads what changed in the directory (true); when it cannot be reached, the outage policy
    /// decides, as for a lookup (FailClosed gives up; ServeFromCache goes on with the cached
    /// route: false).
    async fn refresh_or_degrade(&self, entry: &Entry) -> Result<bool> {
        match self.directory.refresh().await {
            Ok(_) => Ok(true),
            Err(e) if e.is_directory_outage() => {
                tracing::debug!(entity = %self.key, error = %e, "refresh failed during a retry");
                self.directory
                    .degraded(&self.key, Some(Cached::Unchanged(*entry)), e)
                    .map(|_| false)
            }
            Err(e) => Err(e),
        }
    }
}
