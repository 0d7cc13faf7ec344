//! Throwaway PostgreSQL clusters for `shard_directory`'s end-to-end tests, demo and benchmarks:
//! `initdb` + `pg_ctl` on free ports, as the `postgres` user when run as root, stopped on drop
//! (also when a test panics).

mod cluster;
pub mod redis;
pub mod topology;
mod wait;

pub use cluster::{Cluster, Listener};
pub use topology::Topology;
pub use wait::eventually;
