//! One session to the directory or a shard: named, with a bounded connect time, keepalives on
//! both ends and the session settings every tool of the project runs with.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Notification};

use crate::tls::tls;
use crate::ConnectError;

/// What every session runs with, whatever the server's defaults: the text of a value (hashed by
/// the mover's verification, copied by a text COPY) is then the same on every shard, and names
/// resolve in `pg_catalog` first, so no object on a user's path runs in the session. The server
/// side of the connection probes a silent peer every few seconds, so a process whose host
/// vanished lets go of its sessions (and the locks they hold) within about a minute.
pub const SESSION_SETTINGS: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; \
     SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'; \
     SET lc_monetary = 'C'; SET search_path = pg_catalog, pg_temp; \
     SET tcp_keepalives_idle = 15; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3; \
     SET client_connection_check_interval = '5s'";

/// Connects as `application_name` (which names what the session works for, so that another
/// process can find and end it) with a bounded connect time, TCP keepalives and
/// [`SESSION_SETTINGS`]. With `sslmode=require` the connection is TLS, verified (`tls`);
/// otherwise it is plain, as `disable` and `prefer` are here.
pub async fn connect(config: &Config, application_name: &str) -> Result<Client, ConnectError> {
    open(config, application_name, None).await
}

/// [`connect`], and the session's notifications, for a session that LISTENs (the relay's); the
/// channel closes when the connection ends.
pub async fn connect_listening(
    config: &Config,
    application_name: &str,
) -> Result<(Client, UnboundedReceiver<Notification>), ConnectError> {
    let (tx, notifications) = unbounded_channel();
    let client = open(config, application_name, Some(tx)).await?;
    Ok((client, notifications))
}

async fn open(
    config: &Config,
    application_name: &str,
    notifications: Option<UnboundedSender<Notification>>,
) -> Result<Client, ConnectError> {
    let mut config = config.clone();
    config.application_name(application_name);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.keepalives(true);
    let client = if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = config.connect(tls()?).await?;
        tokio::spawn(drive(connection, notifications));
        client
    } else {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(drive(connection, notifications));
        client
    };
    client.batch_execute(SESSION_SETTINGS).await?;
    Ok(client)
}

/// Drives `connection` until it ends, passing its notifications on to a listener.
async fn drive<S, T>(
    mut connection: Connection<S, T>,
    notifications: Option<UnboundedSender<Notification>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notification(n)) => {
                if let Some(tx) = &notifications {
                    let _ = tx.send(n);
                }
            }
            // As tokio-postgres's own connection future logs them (`RUST_LOG=info` shows a
            // server's NOTICE or WARNING, the extension's among them).
            Ok(AsyncMessage::Notice(notice)) => tracing::info!(
                target: "tokio_postgres::connection",
                "{}: {}",
                notice.severity(),
                notice.message()
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "connection closed");
                return;
            }
        }
    }
}
