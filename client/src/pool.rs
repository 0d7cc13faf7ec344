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
use tokio_postgres::{AsyncMessage, CancelToken, Client, Notification, Socket};

#[cfg(feature = "native-tls")]
use crate::error::{Error, Result};

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
            None => platform_default()?,
        };
        Ok(Connector::Native(
            postgres_native_tls::MakeTlsConnector::new(connector),
        ))
    }
}

/// The platform's default connector, made once per process: making one reads and parses the
/// system's root certificates (34 ms of CPU here), which a router handed a pool per shard, or
/// a process starting many directories, would otherwise pay each time. Clones share it.
#[cfg(feature = "native-tls")]
fn platform_default() -> Result<native_tls::TlsConnector> {
    static DEFAULT: std::sync::OnceLock<Result<native_tls::TlsConnector, String>> =
        std::sync::OnceLock::new();
    DEFAULT
        .get_or_init(|| native_tls::TlsConnector::new().map_err(|e| format!("TLS: {e}")))
        .clone()
        .map_err(Error::Config)
}

impl Connector {
    /// The connector for a pool the application built itself (its TLS settings are not known
    /// here), used only to cancel: the platform's default; `None` if it cannot be made.
    pub fn platform() -> Option<Connector> {
        #[cfg(not(feature = "native-tls"))]
        return Some(Connector::Plain);
        #[cfg(feature = "native-tls")]
        Connector::new(None).ok()
    }

    async fn cancel(&self, token: CancelToken) -> Result<(), tokio_postgres::Error> {
        match self {
            #[cfg(not(feature = "native-tls"))]
            Connector::Plain => token.cancel_query(NoTls).await,
            #[cfg(feature = "native-tls")]
            Connector::Native(tls) => token.cancel_query(tls.clone()).await,
        }
    }
}

/// A pooled connection lent to one routed transaction. Dropped before [`Lent::give_back`] (the
/// caller dropped its future, or the attempt's time ran out), it may still be running a
/// statement, holding the shard check's lock: the statement is cancelled (a CancelRequest, within
/// `cancel_within`) and the connection closed, not handed to the next transaction.
pub(crate) struct Lent {
    object: Option<deadpool_postgres::Object>,
    tls: Option<Connector>,
    cancel_within: Duration,
}

impl Lent {
    pub fn new(
        object: deadpool_postgres::Object,
        tls: Option<Connector>,
        cancel_within: Duration,
    ) -> Lent {
        Lent {
            object: Some(object),
            tls,
            cancel_within,
        }
    }

    /// The transaction ended (committed, rolled back, or failed with an answer): the connection
    /// goes back to the pool.
    pub fn give_back(mut self) {
        self.object.take();
    }
}

impl std::ops::Deref for Lent {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        self.object.as_ref().expect("lent until given back")
    }
}

impl std::ops::DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.object.as_mut().expect("lent until given back")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        // Out of the pool: no other transaction gets a connection a cancel may still reach.
        let client = deadpool_postgres::Object::take(object);
        let (Some(tls), Ok(runtime)) = (self.tls.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let within = self.cancel_within;
        runtime.spawn(async move {
            let token = client.cancel_token();
            match tokio::time::timeout(within, tls.cancel(token)).await {
                Ok(Ok(())) => tracing::debug!("cancelled an abandoned routed transaction"),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "could not cancel an abandoned routed transaction")
                }
                Err(_) => tracing::debug!("the shard did not take the cancel request in time"),
            }
            drop(client);
        });
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

/// Aborts a spawned task when dropped.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
