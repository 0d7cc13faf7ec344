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
    #[error("{}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
}

/// A database error as a person needs it: the server's message with its SQLSTATE, DETAIL and
/// HINT; or, for a connection that failed, what failed and each cause (tokio-postgres's own
/// text names only the kind: "db error", "error connecting to server").
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(&format!("; DETAIL: {d}"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!("; HINT: {h}"));
            }
            s
        }
        None => {
            // A connection's error says what failed (a TLS handshake); its sources say why.
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                s.push_str(&format!(": {c}"));
                cause = c.source();
            }
            s
        }
    }
}
