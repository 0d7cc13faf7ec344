//! Where the shards are: `shard_directory.shards.conninfo` in the directory, which a TOML file may
//! override per shard, like Citus's node table. A conninfo never holds a password: like libpq, the
//! mover takes it from `PGPASSWORD` or the password file (`PGPASSFILE`, else `~/.pgpass`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use std::sync::OnceLock;

use postgres_native_tls::MakeTlsConnector;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

use crate::error::{At, Error, Place, Step};

/// Per-shard overrides, from a TOML file:
///
/// ```toml
/// [shards.shard_1]
/// conninfo = "host=10.0.0.1 port=5432 dbname=app user=mover"
/// # how the target's server reaches this shard to subscribe (defaults to conninfo)
/// replication_conninfo = "host=shard1.internal dbname=app user=replicator"
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    #[serde(default)]
    pub shards: BTreeMap<String, ShardOverride>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardOverride {
    pub conninfo: Option<String>,
    pub replication_conninfo: Option<String>,
}

impl Overrides {
    pub fn parse(text: &str) -> Result<Overrides, Error> {
        toml::from_str(text).map_err(|e| Error::Config(format!("shard overrides: {e}")))
    }

    pub fn load(path: &Path) -> Result<Overrides, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Overrides::parse(&text)
    }
}

/// How to reach one shard.
#[derive(Clone)]
pub struct Endpoint {
    pub name: String,
    /// How the mover connects.
    pub config: Config,
    /// How a target's server connects to this shard to subscribe to it.
    pub replication_conninfo: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("hosts", &self.config.get_hosts())
            .field("ports", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .finish_non_exhaustive()
    }
}

/// The shard's endpoint from the registry, with `overrides` applied.
pub(crate) async fn endpoint(
    directory: &Client,
    overrides: &Overrides,
    shard: &str,
) -> Result<Endpoint, Error> {
    let row = directory
        .query_opt(
            "SELECT conninfo FROM shard_directory.shards WHERE shard_name = $1",
            &[&shard],
        )
        .await
        .at(Step::Preflight, crate::error::Place::Directory)?;
    let Some(row) = row else {
        return Err(Error::Preflight {
            problem: format!("shard \"{shard}\" is not in shard_directory.shards"),
            fix: format!(
                "register it in the directory: INSERT INTO shard_directory.shards (shard_name, conninfo) \
                 VALUES ('{shard}', 'host=... port=... dbname=... user=...')"
            ),
        });
    };
    let local = overrides.shards.get(shard);
    let conninfo = local
        .and_then(|o| o.conninfo.clone())
        .or(row.get::<_, Option<String>>(0))
        .ok_or_else(|| Error::Preflight {
            problem: format!("shard \"{shard}\" has no conninfo in shard_directory.shards"),
            fix: format!(
                "UPDATE shard_directory.shards SET conninfo = 'host=... port=... dbname=... user=...' \
                 WHERE shard_name = '{shard}', or give [shards.{shard}] conninfo in --config"
            ),
        })?;
    let config: Config = conninfo
        .parse()
        .map_err(|e| Error::Config(format!("conninfo of shard {shard}: {e}")))?;
    Ok(Endpoint {
        name: shard.to_owned(),
        config: with_password(config),
        replication_conninfo: local
            .and_then(|o| o.replication_conninfo.clone())
            .unwrap_or(conninfo),
    })
}

/// What every session of the mover runs with, whatever the server's defaults: the text of a value
/// (hashed by verification, copied by a text COPY) is then the same on every shard, and names
/// resolve in `pg_catalog` first, so no object on a user's path runs in the mover's session. The
/// server side of the connection probes a silent peer every few seconds, so a mover whose host
/// vanished lets go of its sessions (and the move's lock) within about a minute.
const SESSION_SETTINGS: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; \
     SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'; \
     SET lc_monetary = 'C'; SET search_path = pg_catalog, pg_temp; \
     SET tcp_keepalives_idle = 15; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3; \
     SET client_connection_check_interval = '5s'";

/// Connects with a bounded connect time, TCP keepalives and [`SESSION_SETTINGS`];
/// `application_name` names the move, so that an abort can find and end the sessions a crashed
/// run left behind. With `sslmode=require` the connection is TLS, and the server's certificate is
/// verified against the system's roots or the file `PGSSLROOTCERT` names (stricter than libpq's
/// `require`, which checks nothing); otherwise it is plain, as `disable` and `prefer` are here.
pub(crate) async fn connect(
    config: &Config,
    application_name: &str,
    place: Place,
) -> Result<Client, Error> {
    let (config, at) = session(config, application_name, place);
    let client = if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = config.connect(tls()?).await.map_err(&at)?;
        tokio::spawn(drive(connection));
        client
    } else {
        let (client, connection) = config.connect(NoTls).await.map_err(&at)?;
        tokio::spawn(drive(connection));
        client
    };
    client.batch_execute(SESSION_SETTINGS).await.map_err(at)?;
    Ok(client)
}

/// `config` named `application_name`, with a bounded connect time and TCP keepalives, and how
/// an error of its connection at `place` reads.
fn session(
    config: &Config,
    application_name: &str,
    place: Place,
) -> (Config, impl Fn(tokio_postgres::Error) -> Error) {
    let mut config = config.clone();
    config.application_name(application_name);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.keepalives(true);
    let at = move |e| Error::Db {
        step: Step::Connect,
        place: place.clone(),
        source: e,
    };
    (config, at)
}

/// [`connect`], and the session's notifications, for a session that LISTENs (the relay's); the
/// channel closes when the connection ends.
pub(crate) async fn connect_listening(
    config: &Config,
    application_name: &str,
) -> Result<(Client, UnboundedReceiver<Notification>), Error> {
    let (config, at) = session(config, application_name, Place::Directory);
    let (tx, notifications) = unbounded_channel();
    let client = if config.get_ssl_mode() == SslMode::Require {
        let (client, connection) = config.connect(tls()?).await.map_err(&at)?;
        tokio::spawn(notify(connection, tx));
        client
    } else {
        let (client, connection) = config.connect(NoTls).await.map_err(&at)?;
        tokio::spawn(notify(connection, tx));
        client
    };
    client.batch_execute(SESSION_SETTINGS).await.map_err(at)?;
    Ok((client, notifications))
}

/// Drives `connection`, passing its notifications on.
async fn notify<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: UnboundedSender<Notification>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
        match message {
            Ok(AsyncMessage::Notification(n)) => {
                let _ = tx.send(n);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "connection closed");
                return;
            }
        }
    }
}

async fn drive<F: std::future::Future<Output = Result<(), tokio_postgres::Error>>>(connection: F) {
    if let Err(e) = connection.await {
        tracing::debug!(error = %e, "connection closed");
    }
}

/// The TLS connector, made once: the system's roots, and every certificate in the file
/// `PGSSLROOTCERT` names.
fn tls() -> Result<MakeTlsConnector, Error> {
    static TLS: OnceLock<Result<MakeTlsConnector, String>> = OnceLock::new();
    TLS.get_or_init(|| {
        let mut builder = native_tls::TlsConnector::builder();
        if let Some(path) = std::env::var_os("PGSSLROOTCERT") {
            let named = |e: &dyn std::fmt::Display| {
                format!("PGSSLROOTCERT {}: {e}", Path::new(&path).display())
            };
            let pem = std::fs::read_to_string(&path).map_err(|e| named(&e))?;
            // A bundle: every certificate in the file is a root.
            const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
            for block in pem.split(BEGIN).skip(1) {
                let one = format!("{BEGIN}{block}");
                let root =
                    native_tls::Certificate::from_pem(one.as_bytes()).map_err(|e| named(&e))?;
                builder.add_root_certificate(root);
            }
        }
        let connector = builder.build().map_err(|e| format!("TLS: {e}"))?;
        Ok(MakeTlsConnector::new(connector))
    })
    .clone()
    .map_err(Error::Config)
}

/// libpq's password lookup, which tokio-postgres does not do: `PGPASSWORD`, then the first
/// matching line `host:port:database:user:password` of the password file (`*` matches anything,
/// `\` escapes `:` and `\`).
pub fn with_password(mut config: Config) -> Config {
    if config.get_password().is_some() {
        return config;
    }
    if let Ok(password) = std::env::var("PGPASSWORD") {
        config.password(password);
        return config;
    }
    let file = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")));
    let Some(text) = file.and_then(|f| std::fs::read_to_string(f).ok()) else {
        return config;
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default().to_owned();
    let dbname = config.get_dbname().unwrap_or(&user).to_owned();
    if let Some(password) = pgpass_lookup(&text, [&host, &port, &dbname, &user]) {
        config.password(password);
    }
    config
}

fn pgpass_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass_line(line);
            let [host, port, db, user, password] = fields.as_slice() else {
                return None;
            };
            [host, port, db, user]
                .iter()
                .zip(wanted)
                .all(|(field, want)| *field == "*" || *field == want)
                .then(|| password.clone())
        })
}

fn split_pgpass_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_matches_like_libpq() {
        let file = "# comment\n\
                    db1.internal:5432:app:mover:first\n\
                    *:5433:*:mover:wild\\:card\n\
                    *:*:*:*:fallback\n";
        let get = |h, p, d, u| pgpass_lookup(file, [h, p, d, u]);
        assert_eq!(
            get("db1.internal", "5432", "app", "mover").as_deref(),
            Some("first")
        );
        assert_eq!(
            get("db2.internal", "5433", "x", "mover").as_deref(),
            Some("wild:card")
        );
        assert_eq!(
            get("db1.internal", "5432", "other", "mover").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            pgpass_lookup("h:1:d:u\n", ["h", "1", "d", "u"]),
            None,
            "four fields"
        );
    }

    #[test]
    fn overrides_come_from_toml_and_unknown_keys_are_refused() {
        let o = Overrides::parse(
            "[shards.shard_1]\nconninfo = \"host=a dbname=app user=m\"\n\
             replication_conninfo = \"host=b dbname=app user=r\"\n",
        )
        .unwrap();
        let s = &o.shards["shard_1"];
        assert_eq!(s.conninfo.as_deref(), Some("host=a dbname=app user=m"));
        assert_eq!(
            s.replication_conninfo.as_deref(),
            Some("host=b dbname=app user=r")
        );
        assert!(Overrides::parse("[shards.x]\npassword = \"no\"\n").is_err());
    }
}
