//! What to do when the directory cannot be reached.

use crate::entry::{EntityKey, Entry, State};
use crate::error::Error;

/// What the cache held for an entity when the directory could not be reached.
pub(crate) enum Cached {
    /// Current when cached, and not known to have changed since.
    Unchanged(Entry),
    /// The directory changed it after it was read.
    Changed(Entry),
    /// Cached before the directory changed more than it could say (a full flush): it may have
    /// changed.
    Flushed(Entry),
}

/// The guide's `DIRECTORY_UNAVAILABLE_POLICY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Policy {
    /// Serve the last known entry (counted as `directory.serving_stale`). Placements change
    /// rarely; the alternative is a total outage.
    #[default]
    ServeFromCache,
    /// Refuse to route without the directory.
    FailClosed,
}

impl Policy {
    /// Decides whether `cached`, the entry of `key`, may be served while the directory is unreachable. Entries that are
    /// mid-move always fail closed: that is exactly when a stale placement is wrong. So do entries
    /// the directory is known to have changed since they were read (a move began, say, and the
    /// outage came before the entry was read again).
    pub(crate) fn degraded(
        self,
        key: &EntityKey,
        cached: Option<Cached>,
        unreachable: impl FnOnce() -> Error,
    ) -> Result<Entry, Error> {
        match (self, cached) {
            (Policy::ServeFromCache, Some(Cached::Unchanged(e))) if e.state == State::Active => {
                Ok(e)
            }
            (Policy::ServeFromCache, Some(Cached::Changed(e))) => Err(Error::FailClosed {
                entity: key.clone(),
                state: Some(e.state),
                reason: "its entry changed after it was cached",
            }),
            (Policy::ServeFromCache, Some(Cached::Flushed(e))) => Err(Error::FailClosed {
                entity: key.clone(),
                state: Some(e.state),
                reason: "it was cached before a change the directory could not name (a full flush)",
            }),
            (Policy::ServeFromCache, Some(Cached::Unchanged(e))) => Err(Error::FailClosed {
                entity: key.clone(),
                state: Some(e.state),
                reason: "the entity is mid-move",
            }),
            (
                Policy::FailClosed,
                Some(Cached::Unchanged(e) | Cached::Changed(e) | Cached::Flushed(e)),
            ) => Err(Error::FailClosed {
                entity: key.clone(),
                state: Some(e.state),
                reason: "policy is FailClosed",
            }),
            (_, None) => Err(unreachable()),
        }
    }
}
