//! Connections that never wait forever, encrypted as their connection string asks: every pool
//! (the directory's store, each shard's) and the watcher's connection get a connect timeout,
//! TCP keepalives and the TLS connector, and a pool gives up waiting for a free or new
//! connection after a bound.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::tls::MakeTlsConnect;
#[cfg(not(feature = "native-tls"))]
use tokio_postgres::NoTls;
use tokio_postgres::{AsyncMessage, Client, Notification, Socket};

#[cfg(feature = "native-tls")]
use crate::error::{Error, Result};
use crate::watcher::AbortOnDrop;

/// How long to wait for the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub query: Duration,
}

/// The TLS connector of a set of connections. TLS is used as the connection string's `sslmode`
/// says (`disable`, `prefer`, `require`); without feature `native-tls` there is none, and
/// `sslmode=require` fails to connect.
#[derive(Clone)]
pub(crate) enum Connector {
    #[cfg(not(feature = "native-tls"))]
    Plain,
    #[cfg(feature = "native-tls")]
    Native(postgres_native_tls::MakeTlsConnector),
}

#[cfg(feature = "native-tls")]
impl Connector {
    /// The connector for `tls` (feature `native-tls`: `None` is the platform's default, which
    /// verifies the server's certificate and name against the system's roots).
    pub fn new(tls: Option<&native_tls::TlsConnector>) -> Result<Connector> {
        let connector = match tls {
            Some(c) => c.clone(),
            None => {
                native_tls::TlsConnector::new().map_err(|e| Error::Config(format!("TLS: {e}")))?
            }
        };
        Ok(Connector::Native(
            postgres_native_tls::MakeTlsConnector::new(connector),
        ))
    }
}

/// Sets a connect timeout (unless the connection string has one) and TCP keepalives, so that a
/// peer that vanished is noticed by the kernel, not only by the next query.
fn harden(config: &mut tokio_postgres::Config, connect: Duration) {
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
    tls: &Connector,
) -> Result<Pool, deadpool_postgres::BuildError> {
    harden(&mut config, timeouts.connect);
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls {
        #[cfg(not(feature = "native-tls"))]
        Connector::Plain => Manager::from_config(config, NoTls, manager_config),
        #[cfg(feature = "native-tls")]
        Connector::Native(tls) => Manager::from_config(config, tls.clone(), manager_config),
    };
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeouts.query))
        .create_timeout(Some(timeouts.connect))
        .recycle_timeout(Some(timeouts.query))
        .build()
}

/// What a session connection's driver passes on: notifications, then the error that ended it.
pub(crate) type Messages = mpsc::UnboundedReceiver<Result<Notification, tokio_postgres::Error>>;

/// One connection of its own (the watcher's), driven by a task that stops when the returned
/// guard drops.
pub(crate) async fn connect(
    mut config: tokio_postgres::Config,
    connect_timeout: Duration,
    tls: &Connector,
) -> Result<(Client, Messages, AbortOnDrop), tokio_postgres::Error> {
    harden(&mut config, connect_timeout);
    match tls {
        #[cfg(not(feature = "native-tls"))]
        Connector::Plain => drive(&config, NoTls).await,
        #[cfg(feature = "native-tls")]
        Connector::Native(tls) => drive(&config, tls.clone()).await,
    }
}

async fn drive<T>(
    config: &tokio_postgres::Config,
    tls: T,
) -> Result<(Client, Messages, AbortOnDrop), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let (tx, messages) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(Ok(n));
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    Ok((client, messages, AbortOnDrop(driver)))
}
