//! The retry loop: a refused or failed attempt repaired (the directory re-read, or the shard's
//! `moved_to` taken) and run again after a backoff, within the deadline.

use super::*;

impl Router {
    pub(super) async fn with_retries<T, E, F>(
        &self,
        key: &EntityKey,
        mode: Mode,
        f: &mut F,
    ) -> Result<Reads<T>, E>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: From<Error> + 'static,
    {
        let started = Instant::now();
        let mut attempt = 0;
        let span = tracing::info_span!(
            "shard_directory.route",
            entity = %key,
            attempt = tracing::field::Empty,
            shard = tracing::field::Empty,
            version = tracing::field::Empty,
        );
        loop {
            attempt += 1;
            span.record("attempt", attempt);
            let (entry, version) = self.directory.route(key).instrument(span.clone()).await?;
            span.record("shard", tracing::field::display(&entry.shard_name));
            span.record("version", version);
            let backoff = self.retry.backoff(attempt);
            let out_of_time = started.elapsed() + backoff > self.retry.deadline;
            let counters = self.directory.counters();
            // Every attempt, the pool wait included, is bounded (a re-run by the deadline too);
            // one still running then is dropped, and its statement cancelled.
            let left = match attempt {
                1 => self.retry.attempt_timeout,
                _ => (self.retry.deadline.saturating_sub(started.elapsed()))
                    .min(self.retry.attempt_timeout),
            };
            let at = Progress::default();
            let once = self.once(key, &entry, version, mode, left, &at, f);
            let outcome = match tokio::time::timeout(left, once.instrument(span.clone())).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(at.timed_out(left).into()),
            };
            let (rejection, source) = match outcome {
                Ok(t) => return Ok(t),
                Err(Attempt::Fatal(e)) => return Err(e.into()),
                Err(Attempt::Caller(e)) => return Err(e),
                Err(Attempt::Again) => continue,
                Err(Attempt::ReadOnly) if out_of_time => {
                    tracing::warn!(entity = %key, attempts = attempt, "gave up waiting for a cutover to end");
                    return Err(Error::ReadOnly(key.clone()).into());
                }
                Err(Attempt::ReadOnly) => {
                    counters.retried();
                    // Not only the cached state: the cutover may have committed while this
                    // client was not told (no LISTEN behind a pooler). And a freeze whose mover
                    // vanished ends with its lease: the directory is asked to release it.
                    if !self.directory.release_if_expired(key).await {
                        tokio::time::sleep(backoff).await;
                        self.refresh_or_degrade(key, &entry).await?;
                    }
                    continue;
                }
                Err(Attempt::Refused(rejection, source)) => (rejection, source),
            };
            counters.rejected(rejection.reason());
            tracing::debug!(entity = %key, %rejection, attempt, "shard refused the transaction");
            let give_up = |rejection| match source {
                Refusal::Ours(source) => Error::Rejected {
                    entity: key.clone(),
                    attempts: attempt,
                    rejection,
                    source,
                }
                .into(),
                Refusal::Caller(e) => e,
            };
            // Another entity's row, which lives elsewhere now: following its `moved_to` would
            // route this entity's next writes to a shard the directory does not name for it.
            if out_of_time
                || matches!(rejection, Rejection::Other(_))
                || rejection.about_another(key)
            {
                tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
                return Err(give_up(rejection));
            }
            counters.retried();
            match &rejection {
                Rejection::Moved {
                    moved_to, version, ..
                } if self.can_route_to(moved_to) => {
                    self.directory.learn_moved(key, &entry, moved_to, *version);
                    // The refusal said where to go: the first time, straight there.
                    if attempt == 1 {
                        continue;
                    }
                }
                // A shard this router cannot reach (retired, or not learned yet): the
                // directory says where the entity is, not the refusal.
                Rejection::Moved { .. } | Rejection::Stale { .. } | Rejection::Missing => {
                    let refreshed = self.refresh_or_degrade(key, &entry).await?;
                    // A minimum the directory has not reached: no refresh cures it (a failover
                    // that lost the directory's last changes, a minimum raised by hand).
                    if let (
                        true,
                        Rejection::Stale {
                            minimum: Some(minimum),
                        },
                    ) = (refreshed, &rejection)
                    {
                        let (minimum, known) = (*minimum, self.directory.version());
                        if known < minimum {
                            return Err(Error::DirectoryBehind {
                                entity: key.clone(),
                                shard: entry.shard_name.to_string(),
                                minimum,
                                directory_version: known,
                            }
                            .into());
                        }
                    }
                }
                Rejection::Frozen | Rejection::Serialization | Rejection::Other(_) => {}
            }
            // The refresh took its time: an attempt that could not end by the deadline is not
            // begun, and the refusal says why.
            if started.elapsed() + backoff >= self.retry.deadline {
                tracing::warn!(entity = %key, %rejection, attempts = attempt, "shard kept refusing the transaction; giving up");
                return Err(give_up(rejection));
            }
            tokio::time::sleep(backoff).await;
        }
    }

    /// Reads what changed in the directory (true); when it cannot be reached, the outage policy
    /// decides, as for a lookup (FailClosed gives up; ServeFromCache goes on with the cached
    /// route: false).
    async fn refresh_or_degrade(&self, key: &EntityKey, entry: &Entry) -> Result<bool> {
        match self.directory.refresh().await {
            Ok(_) => Ok(true),
            Err(e) if e.is_directory_outage() => {
                tracing::debug!(entity = %key, error = %e, "refresh failed during a retry");
                self.directory
                    .degraded(key, Some(Cached::Unchanged(*entry)), e)
                    .map(|_| false)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this router has, or can learn, a pool for `shard`.
    fn can_route_to(&self, shard: &str) -> bool {
        self.learn.is_some() || self.shards.read().expect("shards lock").contains_key(shard)
    }
}
