//! In-database tests: each runs inside one transaction of a real backend, so they cover the
//! rules within a transaction. What needs commits or several sessions (notifications, races,
//! `placement_at` across transactions) is in the end-to-end suite under `tests/`.

mod directory;
mod helpers;
mod privileges;
mod shard;
