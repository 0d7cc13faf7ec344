//! The retry loop: each attempt routed by [`Routing`] (which waits out a freeze and says what a
//! refusal teaches), run on this router's pools within its time, and re-run while it says so.

use super::*;
use crate::routing::{Routing, Verdict};

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
        let write = matches!(mode, Mode::Write(options) if !options.read_only);
        let mut routing = Routing::new(&self.directory, key.clone(), self.retry.clone(), write);
        let span = tracing::info_span!(
            "shard_directory.route",
            entity = %key,
            attempt = tracing::field::Empty,
            shard = tracing::field::Empty,
            version = tracing::field::Empty,
        );
        loop {
            let route = routing.next().instrument(span.clone()).await?;
            span.record("attempt", route.attempt);
            span.record("shard", tracing::field::display(&route.entry.shard_name));
            span.record("version", route.version);
            // Every attempt, the pool wait included, is bounded (a re-run by the deadline too);
            // one still running then is dropped, and its statement cancelled.
            let left = route.time_left;
            let at = Progress::default();
            let once = self.once(key, &route.entry, route.version, mode, left, &at, f);
            let outcome = match tokio::time::timeout(left, once.instrument(span.clone())).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(at.timed_out(left).into()),
            };
            let (rejection, source) = match outcome {
                Ok(t) => return Ok(t),
                Err(Attempt::Fatal(e)) => return Err(e.into()),
                Err(Attempt::Caller(e)) => return Err(e),
                Err(Attempt::Again) => continue,
                Err(Attempt::Refused(rejection, source)) => (rejection, source),
            };
            let verdict = routing
                .refused(&route, &rejection, |shard| self.can_route_to(shard))
                .await?;
            if verdict == Verdict::GiveUp {
                return Err(match source {
                    Refusal::Ours(source) => Error::Rejected {
                        entity: key.clone(),
                        attempts: route.attempt,
                        rejection,
                        source,
                    }
                    .into(),
                    Refusal::Caller(e) => e,
                });
            }
        }
    }

    /// Whether this router has, or can learn, a pool for `shard`.
    fn can_route_to(&self, shard: &str) -> bool {
        self.learn.is_some() || self.shards.read().expect("shards lock").contains_key(shard)
    }
}
