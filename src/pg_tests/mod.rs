//! In-database tests: each runs inside one transaction of a real backend, so they cover the
//! rules within a transaction. What needs commits or several sessions (notifications, races,
//! `placement_at` across transactions) is in the end-to-end suite (`e2e/tests/suite/`).
//!
//! `helpers`: what the tests share (a change versioned as at commit, a refusal, a value read);
//! `directory`, `shard`, `privileges`: the tests of each area, each in schema `tests` (where the
//! pgrx harness calls them).

mod directory;
mod helpers;
mod privileges;
mod shard;
