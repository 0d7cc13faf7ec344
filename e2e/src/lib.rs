//! The harness of `shard_directory`'s end-to-end tests, demo and benchmarks: throwaway
//! PostgreSQL clusters (`initdb` + `pg_ctl` on free ports, as the `postgres` user when run as
//! root, stopped on drop, also when a test panics), written once.
//!
//! - `cluster`: one cluster ([`Cluster`]), its standby, its server log;
//! - `topology`: a directory and shards with the extension, tenants, a client and a mover over
//!   them ([`Topology`]);
//! - `workload`: the application's writes and reads, and the audit of every acknowledged one;
//!   `wide`: the wider proof's schema and writes;
//! - `mover_cli`: the `shard-directory` CLI as an operator runs it (and kills it);
//!   `console`: its web console, read as a browser reads it;
//!   `observe`: observers that act on a move at a phase;
//! - `proxy`, `pgbouncer`, `redis`: what stands between a client and a cluster, or beside it;
//!   `prometheus`: a sample of the exporter's text;
//! - `fuzz`: SQLsmith against a shard of every protected table's shape, as the application role,
//!   with its two oracles (no crash, no fenced row written);
//! - `sweep`: the failpoint sweep: every step of a move faulted every way, the invariants checked;
//!   `history`: the randomized history: routers of every kind writing while the directory is
//!   restarted, restored and promoted, every acknowledged write held against what it named;
//! - `wait`: waiting on a condition with a deadline, and on a backend's lock; `column`: a
//!   query's first column.
//!
//! The tests are in `tests/suite/` (one binary), except `client_metrics`, `client_tracing` and
//! `mover_metrics`, which install process-wide recorders and run in processes of their own.

mod cluster;
mod column;
pub mod console;
pub mod fuzz;
pub mod history;
pub mod mover_cli;
pub mod observe;
pub mod pgbouncer;
pub mod prometheus;
pub mod proxy;
pub mod redis;
pub mod sweep;
pub mod topology;
mod wait;
pub mod wide;
pub mod workload;

pub use cluster::{lag_for_a_second, Cluster, ColdCopy, CpuTimes, Frozen, Install, Listener};
pub use column::column;
pub use topology::{reaches, Topology};
pub use wait::{backend_pid, blocked_on, eventually, within, ANY_LOCK};
