//! `shard-directory-connect`: how the project's tools (the mover and its CLI, the relay) connect
//! to the directory and the shards, as a DBA used to libpq expects: the password from
//! `PGPASSWORD` or the password file ([`with_password`]), `sslmode=require` verified against the
//! system's roots or `PGSSLROOTCERT` (`tls`), a bounded connect time, keepalives, and session
//! settings that make every value's text the same on every server ([`connect`],
//! [`connect_listening`]).

mod pgpass;
mod session;
mod tls;

pub use pgpass::with_password;
pub use session::{connect, connect_listening, SESSION_SETTINGS};

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TLS connector could not be made (`PGSSLROOTCERT` unreadable, a bad certificate).
    #[error("{0}")]
    Tls(String),
    /// The server refused or did not answer, or the session settings failed.
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
}
