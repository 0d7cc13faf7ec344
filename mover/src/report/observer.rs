//! What a move reports while it runs. The CLI draws progress bars from it; tests use `phase` and
//! `step` to hold a move there, as a crash would leave it, or to act behind its back.

use futures_util::future::BoxFuture;

use crate::directory::phase::Phase;
use crate::error::Step;

pub trait Observer: Send + Sync {
    /// The move's record now says `phase`. The move goes on when the returned future completes.
    fn phase(&self, move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        tracing::info!(move_id, %phase, "move entered a phase");
        Box::pin(std::future::ready(()))
    }

    /// The move begins `step` within its phase: [`Step::Verify`] for the check while the entity
    /// is writable, [`Step::CatchUp`] for each estimate of the freeze, [`Step::Freeze`] once it is
    /// about to freeze. The move goes on when the returned future completes.
    fn step(&self, move_id: i64, step: Step) -> BoxFuture<'_, ()> {
        tracing::debug!(move_id, %step, "move began a step");
        Box::pin(std::future::ready(()))
    }

    /// Rows of `table` copied (or deleted) so far, of `total`.
    fn rows(&self, move_id: i64, table: &str, done: i64, total: i64) {
        tracing::debug!(move_id, table, done, total, "rows");
    }

    /// Bytes of source WAL the target has not confirmed.
    fn lag(&self, move_id: i64, bytes: i64) {
        tracing::debug!(move_id, bytes, "replication lag");
    }

    /// Anything else worth a line.
    fn note(&self, move_id: i64, message: &str) {
        tracing::info!(move_id, message);
    }
}

/// Logs through `tracing` and holds nothing up.
pub struct LogObserver;

impl Observer for LogObserver {}
