//! The one error type of the client. Each variant says whether a retry can help.

use crate::entry::{EntityKey, State};
use crate::rejection::Rejection;

/// Everything that can go wrong when looking up or routing; [`Error::is_retryable`] says whether a retry can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The directory store could not be reached and the policy did not allow serving from cache.
    #[error("shard directory unavailable: {0}")]
    DirectoryUnavailable(#[source] tokio_postgres::Error),
    /// The directory did not answer within the configured time (a connection, a query, a free
    /// pool slot): treated as unreachable.
    #[error("shard directory did not answer {what} within {after:?}")]
    DirectoryTimeout {
        /// What was waited for.
        what: &'static str,
        /// The configured bound.
        after: std::time::Duration,
    },
    /// The directory answered with an error (permissions, a missing extension, ...).
    #[error("shard directory query failed: {0}")]
    Directory(#[source] tokio_postgres::Error),
    /// The directory has no entry for the entity.
    #[error("no directory entry for {0}")]
    UnknownEntity(EntityKey),
    /// The entry names a shard this router has no connection settings for.
    #[error("no connection settings for shard \"{shard}\" (entry {entity})")]
    UnknownShard {
        /// The entity being routed.
        entity: EntityKey,
        /// The shard its entry names.
        shard: String,
    },
    /// The entity is `read_only` (a cutover is running): writes are refused before any round trip.
    #[error("{0} is read_only: writes are refused while its cutover runs")]
    ReadOnly(EntityKey),
    /// The directory is unreachable and the entity is mid-move (or the policy is `FailClosed`).
    #[error("shard directory unavailable and {entity} cannot be served from cache ({reason})")]
    FailClosed {
        /// The entity being looked up.
        entity: EntityKey,
        /// Its last known state, if it was cached.
        state: Option<State>,
        /// Why it could not be served.
        reason: &'static str,
    },
    /// The shard kept refusing the transaction as routed with a stale directory.
    #[error("{entity}: shard refused the transaction {attempts} times, last as {rejection}")]
    Rejected {
        /// The entity being routed.
        entity: EntityKey,
        /// Attempts made, the first included.
        attempts: u32,
        /// How the last attempt was refused.
        rejection: Rejection,
        /// The shard's last error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Could not get a connection to a shard.
    #[error("shard \"{shard}\" unavailable: {source}")]
    ShardUnavailable {
        /// The shard.
        shard: String,
        /// Why no connection could be had.
        #[source]
        source: deadpool_postgres::PoolError,
    },
    /// The connection to a shard was lost at `step`: `"begin"` or `"stamp"` (the transaction
    /// did not commit: retryable) or `"commit"` (it may have committed: not retryable blindly).
    #[error("connection to shard \"{shard}\" lost at {step}: {source}")]
    ShardConnection {
        /// The shard.
        shard: String,
        /// Where the transaction was.
        step: &'static str,
        /// The connection's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A shard requires a directory version the directory has not reached: no refresh can
    /// route this (the directory failed over and lost its last changes, or a shard's minimum
    /// was raised by hand past it).
    #[error(
        "{entity}: shard \"{shard}\" requires directory version {minimum}, and the directory \
         is at {directory_version}: no refresh can route this"
    )]
    DirectoryBehind {
        /// The entity being routed.
        entity: EntityKey,
        /// The shard that refused.
        shard: String,
        /// The version it requires.
        minimum: i64,
        /// The directory's version, read after the refusal.
        directory_version: i64,
    },
    /// A routed transaction did not finish within the retry deadline; `step` says where it was:
    /// before `"commit"` nothing committed (retryable), at `"commit"` it may have.
    #[error("shard \"{shard}\" did not finish {step} within {after:?}")]
    ShardTimeout {
        /// The shard.
        shard: String,
        /// Where the transaction was.
        step: &'static str,
        /// The deadline.
        after: std::time::Duration,
    },
    /// The directory answers, but this client's connections to it are all busy (a burst of
    /// lookups): not an outage, so the outage policy does not apply; retryable.
    #[error("every connection to the shard directory stayed busy for {after:?}")]
    DirectoryBusy {
        /// How long a free connection was waited for.
        after: std::time::Duration,
    },
    /// The closure returned `Ok`, but the routed transaction was no longer open to commit
    /// ([`AbortCause`] says why). Not retried: the closure chose to go on.
    #[error("{entity}: the routed transaction on shard \"{shard}\" {cause}")]
    Aborted {
        /// The entity being routed.
        entity: EntityKey,
        /// The shard it ran on.
        shard: String,
        /// What ended it.
        cause: AbortCause,
    },
    /// Any other database error, returned untouched.
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    /// Bad configuration (a pool that cannot be built, ...).
    #[error("configuration: {0}")]
    Config(String),
}

/// What ended a routed transaction before the router's COMMIT ([`Error::Aborted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AbortCause {
    /// An error the closure caught aborted it: PostgreSQL answers COMMIT there with ROLLBACK,
    /// so nothing was committed.
    #[error(
        "was aborted by an error the closure caught; it was rolled back, nothing was committed"
    )]
    CaughtError,
    /// A COMMIT or ROLLBACK statement of the closure's own ended it: what that committed stays,
    /// and what followed ran outside the routed transaction, unstamped.
    #[error(
        "was ended by the closure's own COMMIT or ROLLBACK; what that committed stays, and what \
         followed ran unstamped"
    )]
    EndedByTheClosure,
}

impl Error {
    /// Whether the directory could not be reached (or did not answer in time): what the outage
    /// policy covers.
    pub fn is_directory_outage(&self) -> bool {
        matches!(
            self,
            Error::DirectoryUnavailable(_) | Error::DirectoryTimeout { .. }
        )
    }

    /// Whether a shard could not be reached, or stopped answering (not a refusal or an error it
    /// answered with).
    pub fn is_shard_unreachable(&self) -> bool {
        matches!(
            self,
            Error::ShardUnavailable { .. }
                | Error::ShardConnection { .. }
                | Error::ShardTimeout { .. }
        )
    }

    /// Whether running the same work again later can succeed without a code or config change.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::DirectoryUnavailable(_)
            | Error::DirectoryTimeout { .. }
            | Error::ReadOnly(_)
            | Error::FailClosed { .. }
            | Error::Rejected { .. }
            | Error::ShardUnavailable { .. }
            | Error::DirectoryBusy { .. } => true,
            Error::ShardConnection { step, .. } | Error::ShardTimeout { step, .. } => {
                *step != "commit"
            }
            Error::DirectoryBehind { .. } | Error::Aborted { .. } => false,
            Error::Db(e) | Error::Directory(e) => transient(e),
            Error::UnknownEntity(_) | Error::UnknownShard { .. } | Error::Config(_) => false,
        }
    }
}

/// Whether a database error can pass with time: a serialization failure or deadlock, a server
/// shutting down, too many connections, or a connection that failed or closed.
fn transient(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    connection_lost(e)
        || e.code().is_some_and(|code| {
            [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code)
        })
}

/// Whether `e` says the connection is gone (closed, I/O, the server shutting down, 08xxx).
pub(crate) fn connection_lost(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    match e.code() {
        Some(code) => {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code)
                || code.code().starts_with("08")
        }
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
