//! Connections that never wait forever: every pool (the directory's store, each shard's) and the
//! watcher's connection get a connect timeout and TCP keepalives, and a pool gives up waiting for
//! a free or new connection after a bound.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

/// How long to wait for the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub query: Duration,
}

/// Sets a connect timeout (unless the connection string has one) and TCP keepalives, so that a
/// peer that vanished is noticed by the kernel, not only by the next query.
pub(crate) fn harden(config: &mut tokio_postgres::Config, connect: Duration) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(connect);
    }
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
}

/// A pool of `size` connections that waits at most `timeouts` for one.
pub(crate) fn build(
    mut config: tokio_postgres::Config,
    size: usize,
    timeouts: Timeouts,
) -> Result<Pool, deadpool_postgres::BuildError> {
    harden(&mut config, timeouts.connect);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeouts.query))
        .create_timeout(Some(timeouts.connect))
        .recycle_timeout(Some(timeouts.query))
        .build()
}
