//! The end-to-end suite, in one binary: each module is what a part of `shard_directory` does
//! against real clusters, as a client, an operator or a DBA meets it.

mod cli;
mod client;
mod client_bounds;
mod client_faults;
mod client_invalidation;
mod client_routing;
mod directory;
mod drills;
mod dump;
mod failover;
mod history;
mod history_edges;
mod mixed_fleet;
mod mover;
mod mover_batch;
mod mover_ddl;
mod mover_faults;
mod mover_interrupted;
mod mover_paced;
mod mover_privileges;
mod mover_reversible;
mod mover_schemas;
mod mover_tls;
mod mover_triggers;
mod package;
mod proof;
mod randomized_history;
mod regress;
mod relay;
mod replicas;
mod shard;
mod shard_sql;
mod shared_cache;
mod sweep;
mod upgrade;
