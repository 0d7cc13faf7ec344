//! One attempt: one transaction on one shard, begun, stamped with the client's version (and
//! checked), the caller's closure run, committed, all within the attempt's time.

use super::stamp::{STAMP, STAMP_AND_CHECK, STAMP_AND_READ_CHECK};
use super::*;
use crate::error::AbortCause;
use futures_util::TryStreamExt;
use tokio_postgres::error::SqlState;

impl Router {
    /// One attempt of `mode` at the route `entry` gives, stamped with `version`. (A method, not a closure: an async
    /// closure borrowing `&self` would make the caller's future `Send` for one lifetime only.)
    /// `left`: the time the attempt has (its pool waits and its statements are bounded by it);
    /// `at`: where it is, for the error that says so if the time runs out.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn once<T, E, F>(
        &self,
        key: &EntityKey,
        entry: &Entry,
        version: i64,
        mode: Mode,
        left: Duration,
        at: &Progress,
        f: &mut F,
    ) -> Result<Reads<T>, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        let shard = &entry.shard_name;
        let bound = Bound { left, at };
        let stamped = |options, sql| Stamp {
            key,
            version,
            options,
            sql,
        };
        match mode {
            Mode::Write(options) => {
                let one = self
                    .attempt(shard, &stamped(options, &STAMP_AND_CHECK), &bound, f)
                    .await?;
                Ok(Reads::One(one))
            }
            Mode::Read { checked } => {
                let options = TxOptions::default().read_only();
                let sql: &'static str = if checked {
                    &STAMP_AND_READ_CHECK
                } else {
                    &STAMP
                };
                let stamp = stamped(options, sql);
                let source = self.attempt(shard, &stamp, &bound, f).await?;
                let (State::Migrating, Some(target)) = (&entry.state, &entry.target_shard) else {
                    return Ok(Reads::One(source));
                };
                match self.attempt(target, &stamp, &bound, f).await {
                    Ok(target) => Ok(Reads::Both { source, target }),
                    // The source still owns every row: its answer stands without the target's.
                    Err(Attempt::Fatal(e)) if e.is_shard_unreachable() => {
                        tracing::warn!(entity = %key, shard = %target, error = %e,
                            "the target of a migrating entity could not be read; returning the source's answer");
                        Ok(Reads::SourceOnly {
                            source,
                            target_unavailable: e.to_string(),
                        })
                    }
                    Err(other) => Err(other),
                }
            }
        }
    }

    /// One transaction on `shard`, begun and stamped as `stamp` says, within `bound`: the wait
    /// for a pooled connection, and every statement on the server (`statement_timeout`, and
    /// `idle_in_transaction_session_timeout` for a caller that stops in the middle), end by the
    /// deadline; an attempt dropped before it ends has its statement cancelled ([`Lent`]), so
    /// nothing it began holds the shard after it. An `Err` from `f` rolls it back; an `Ok` is
    /// committed if the transaction is still open (not aborted, not ended by `f`), else
    /// [`Error::Aborted`].
    pub(super) async fn attempt<T, E, F>(
        &self,
        shard: &str,
        stamp: &Stamp<'_>,
        bound: &Bound<'_>,
        f: &mut F,
    ) -> Result<T, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        bound.at.step(shard, "connect");
        let routed = self.shard(shard, stamp.key).await.map_err(Attempt::Fatal)?;
        // A pool of the application's own may have no wait bound (nor the runtime one needs):
        // the attempt's bound covers it.
        let mut timeouts = routed.pool.timeouts();
        if timeouts.wait.is_some() {
            timeouts.wait = Some(bound.left);
        }
        let client = routed.pool.timeout_get(&timeouts).await.map_err(|source| {
            Attempt::Fatal(Error::ShardUnavailable {
                shard: shard.to_owned(),
                source,
            })
        })?;
        let mut lent = Lent::new(client, routed.tls.clone(), routed.connect_timeout);
        let ended = self
            .transact(shard, &routed, &mut lent, stamp, bound, f)
            .await;
        lent.give_back();
        ended
    }

    /// The transaction of [`Router::attempt`] on `client`, a connection of `routed`.
    async fn transact<T, E, F>(
        &self,
        shard: &str,
        routed: &Shard,
        client: &mut deadpool_postgres::Object,
        &Stamp {
            key,
            version,
            options,
            sql: stamp,
        }: &Stamp<'_>,
        bound: &Bound<'_>,
        f: &mut F,
    ) -> Result<T, Attempt<E>>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, E>,
        E: 'static,
    {
        let Shard {
            statements,
            read_check,
            ..
        } = routed;
        bound.at.step(shard, "begin");
        let mut begin = client.build_transaction().read_only(options.read_only);
        if let Some(level) = options.isolation {
            begin = begin.isolation_level(level);
        }
        let tx = begin
            .start()
            .await
            .map_err(|e| Attempt::db(shard, "begin", e))?;
        // One round trip: prepared once per connection, or unnamed.
        bound.at.step(shard, "stamp");
        let version = version.to_string();
        let left = super::stamp::left_ms(bound.left);
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&version, Type::TEXT),
            (&key.entity_type, Type::TEXT),
            (&key.entity_id, Type::TEXT),
            (&left, Type::TEXT),
        ];
        // A shard whose extension predates the read check: read it unchecked, saying so once.
        let stamp = if stamp == *STAMP_AND_READ_CHECK && !read_check.load(Ordering::Relaxed) {
            &STAMP
        } else {
            stamp
        };
        let stamped = statements.query(&tx, &*tx, stamp, params).await;
        match stamped {
            Err(e)
                if stamp == *STAMP_AND_READ_CHECK
                    && e.code() == Some(&SqlState::UNDEFINED_FUNCTION) =>
            {
                tracing::warn!(
                    shard,
                    "the shard's shard_directory has no check for reads \
                    (ALTER EXTENSION shard_directory UPDATE there): its reads go unchecked"
                );
                read_check.store(false, Ordering::Relaxed);
                return Err(Attempt::Again);
            }
            stamped => stamped.map_err(|e| Attempt::db(shard, "stamp", e))?,
        };
        bound.at.step(shard, "the caller's statements");
        let aborted = |cause| {
            Attempt::Fatal(Error::Aborted {
                entity: key.clone(),
                shard: shard.to_owned(),
                cause,
            })
        };
        match f(&tx).await {
            Ok(out) => {
                bound.at.step(shard, "commit");
                // Sent ahead of the COMMIT, in its round trip, and read after it.
                let probe = tx.client().simple_query_raw(STILL_OPEN).await;
                let committed = tx.commit().await;
                let probed = match probe {
                    Ok(answers) => answers.try_collect::<Vec<_>>().await.map(drop),
                    Err(e) => Err(e),
                };
                match probed.as_ref().err().and_then(|e| e.code()) {
                    Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => {
                        return Err(aborted(AbortCause::CaughtError));
                    }
                    Some(&SqlState::NO_ACTIVE_SQL_TRANSACTION) => {
                        return Err(aborted(AbortCause::EndedByTheClosure));
                    }
                    _ => {}
                }
                committed
                    .and(probed)
                    .map_err(|e| Attempt::db(shard, "commit", e))?;
                Ok(out)
            }
            Err(e) => {
                // Best effort: a broken connection rolls back by itself.
                let _ = tx.rollback().await;
                match Attempt::caller(e) {
                    // Unstamped after the stamp: the closure ended the transaction and went
                    // on. A re-run would commit what it committed again.
                    Attempt::Refused(Rejection::Missing, _) => {
                        Err(aborted(AbortCause::EndedByTheClosure))
                    }
                    other => Err(other),
                }
            }
        }
    }
}

/// The statement sent just before the router's COMMIT. PostgreSQL answers the COMMIT of an
/// aborted transaction with ROLLBACK, not an error, and tokio-postgres does not read the tag
/// (rust-postgres#1342); a SAVEPOINT fails there (25P02), and outside a transaction block
/// (25P01: the closure ended it), and otherwise commits with the rest, having written nothing.
const STILL_OPEN: &str = "SAVEPOINT shard_directory_commit";

/// What a routed transaction is stamped with, and how it begins.
pub(super) struct Stamp<'a> {
    key: &'a EntityKey,
    version: i64,
    options: TxOptions,
    /// The stamp's statement (it runs the check, or not).
    sql: &'static str,
}

/// The time an attempt has, and where it is in it.
pub(super) struct Bound<'a> {
    left: Duration,
    at: &'a Progress,
}

/// Where an attempt is (shard and step), for the error that says so when its time runs out.
#[derive(Default)]
pub(super) struct Progress(std::sync::Mutex<Option<(String, &'static str)>>);

impl Progress {
    pub(super) fn step(&self, shard: &str, step: &'static str) {
        *self.0.lock().expect("progress lock") = Some((shard.to_owned(), step));
    }

    pub(super) fn timed_out(&self, after: Duration) -> Error {
        let at = self.0.lock().expect("progress lock").clone();
        let (shard, step) = at.unwrap_or_else(|| ("?".to_owned(), "routing"));
        Error::ShardTimeout { shard, step, after }
    }
}

/// What a routed transaction is.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// `run`: on the owning shard, checked before the closure runs (a read-write one waits out
    /// `read_only` before it: [`crate::Routing::next`]).
    Write(TxOptions),
    /// `read`: read-only, on both shards while the entity is `migrating`; `checked` unless the
    /// caller opted out.
    Read { checked: bool },
}

/// How one attempt ended, when it did not succeed.
pub(super) enum Attempt<E> {
    /// Nothing went wrong that a retry would repeat: re-run at once (the stamp was adapted to
    /// the shard).
    Again,
    /// The shard refused the route (40001): worth re-running.
    Refused(Rejection, Refusal<E>),
    Fatal(Error),
    /// The closure's own error, not a refusal: returned as it is.
    Caller(E),
}

/// The error that carried a refusal: one of the router's statements, or the closure's.
pub(super) enum Refusal<E> {
    Ours(tokio_postgres::Error),
    Caller(E),
}

impl<E: 'static> Attempt<E> {
    /// An error of this crate's own statement at `step` on `shard`: a refusal, a lost
    /// connection (named), or any other database error.
    fn db(shard: &str, step: &'static str, e: tokio_postgres::Error) -> Self {
        match Rejection::of(&e) {
            Some(r) => Attempt::Refused(r, Refusal::Ours(e)),
            None if crate::error::connection_lost(&e) => Attempt::Fatal(Error::ShardConnection {
                shard: shard.to_owned(),
                step,
                source: e,
            }),
            None => Attempt::Fatal(Error::Db(e)),
        }
    }

    /// A refusal is recognised in the closure's error when it is this crate's `Error::Db` (`E`
    /// converts from this crate's `Error`, so it is never a bare `tokio_postgres::Error`); any
    /// other error is returned untouched.
    fn caller(e: E) -> Self {
        let any = &e as &dyn Any;
        let db = match any.downcast_ref::<Error>() {
            Some(Error::Db(db)) => Some(db),
            _ => None,
        };
        match db.and_then(Rejection::of) {
            Some(r) => Attempt::Refused(r, Refusal::Caller(e)),
            None => Attempt::Caller(e),
        }
    }
}
