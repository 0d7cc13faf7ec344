//! Where the shards are: `shard_directory.shards.conninfo` in the directory, which a TOML file may
//! override per shard, like Citus's node table. A conninfo never holds a password: like libpq, the
//! mover takes it from `PGPASSWORD` or the password file (`PGPASSFILE`, else `~/.pgpass`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use shard_directory_connect::{with_password, ConnectError};
use tokio_postgres::{Client, Config};

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

/// Connects (`shard_directory_connect::connect`: the password file, `sslmode=require` verified,
/// a bounded connect time, keepalives, fixed session settings); `application_name` names the
/// move, so that an abort can find and end the sessions a crashed run left behind.
pub(crate) async fn connect(
    config: &Config,
    application_name: &str,
    place: Place,
) -> Result<Client, Error> {
    shard_directory_connect::connect(config, application_name)
        .await
        .map_err(|e| match e {
            ConnectError::Tls(why) => Error::Config(why),
            ConnectError::Db(source) => Error::Db {
                step: Step::Connect,
                place,
                source,
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
