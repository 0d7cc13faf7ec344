//! Shard role: refuse work routed with an outdated view of the directory.
//!
//! `check` is the rule (shard-wide `min_accepted`, then the entity's fence); `key` says which
//! column types may key an entity and the one text form of a key; `locks` closes the
//! gap between a check and a fence; `cached` caches `min_accepted` and fences per backend, kept
//! exactly as fresh as a query would be; `insert_check` runs the check of a plain INSERT in the
//! executor rather than through the triggers; `fences` and `protect` are the DBA's functions;
//! `bypass` is the mover's one way through a fence; `sequences` advances a target's sequence
//! past the source's, never backwards; `stats` counts rejections; `load` counts each entity's
//! checked transactions (`entity_stats()`).

pub(crate) mod bypass;
mod cached;
pub(crate) mod check;
pub(crate) mod fences;
mod insert_check;
mod key;
mod load;
pub(crate) mod locks;
mod protect;
mod sequences;
pub mod stats;

pub fn init() {
    cached::init();
    stats::init();
    load::init();
    insert_check::init();
}
