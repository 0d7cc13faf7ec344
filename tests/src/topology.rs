//! A directory cluster and two shard clusters, wired as the README describes: shards registered in
//! the directory, an `orders` table protected on each shard.

use shard_directory_client::{Directory, DirectoryConfig, Router, ShardConfig};
use tokio_postgres::Client;

use crate::Cluster;

pub const DIRECTORY_DB: &str = "directory";
pub const SHARD_DB: &str = "app";
pub const SHARDS: [&str; 2] = ["shard_1", "shard_2"];

pub struct Topology {
    pub directory: Cluster,
    pub shards: Vec<(String, Cluster)>,
}

impl Topology {
    pub async fn start(name: &str) -> Topology {
        let directory = Cluster::start(&format!("{name}-dir"), &[]);
        directory.create_database_with_extension(DIRECTORY_DB).await;
        let mut shards = Vec::new();
        for shard in SHARDS {
            // Preloaded so that `stats()` counts across backends.
            let cluster = Cluster::start(
                &format!("{name}-{shard}"),
                &[("shared_preload_libraries", "shard_directory")],
            );
            cluster.create_database_with_extension(SHARD_DB).await;
            cluster
                .connect(SHARD_DB)
                .await
                .batch_execute(
                    "CREATE TABLE orders (tenant_id text NOT NULL, item text NOT NULL);
                     SELECT shard_directory.protect('orders', 'tenant_id', 'tenant');",
                )
                .await
                .expect("create orders");
            shards.push((shard.to_owned(), cluster));
        }
        let topology = Topology { directory, shards };
        topology
            .dba()
            .await
            .batch_execute(
                "INSERT INTO shard_directory.shards (shard_name) VALUES ('shard_1'), ('shard_2')",
            )
            .await
            .expect("register shards");
        topology
    }

    pub fn directory_config(&self) -> tokio_postgres::Config {
        self.directory.config(DIRECTORY_DB)
    }

    pub fn shard_cluster(&self, shard: &str) -> &Cluster {
        &self
            .shards
            .iter()
            .find(|(n, _)| n == shard)
            .expect("known shard")
            .1
    }

    /// `(name, connection settings)` of each shard, for a router.
    pub fn shard_configs(&self) -> Vec<(String, tokio_postgres::Config)> {
        self.shards
            .iter()
            .map(|(n, c)| (n.clone(), c.config(SHARD_DB)))
            .collect()
    }

    /// A client `Directory` on this topology's directory database.
    pub async fn client_directory(&self, config: DirectoryConfig) -> Directory {
        Directory::connect(self.directory_config(), config)
            .await
            .expect("connect directory")
    }

    /// A router over both shards.
    pub fn router(&self, directory: Directory) -> Router {
        let shards = self
            .shard_configs()
            .into_iter()
            .map(|(n, c)| ShardConfig::new(n, c));
        Router::new(directory, shards).expect("router")
    }

    /// Runs a directory function that returns a version (`SELECT shard_directory.freeze(...)`).
    pub async fn step(&self, sql: &str) -> i64 {
        self.dba()
            .await
            .query_one(sql, &[])
            .await
            .expect("directory step")
            .get(0)
    }

    /// A DBA's connection to the directory database.
    pub async fn dba(&self) -> Client {
        self.directory.connect(DIRECTORY_DB).await
    }

    pub async fn shard(&self, shard: &str) -> Client {
        self.shard_cluster(shard).connect(SHARD_DB).await
    }

    /// Adds a tenant on `shard`; returns the new directory version.
    pub async fn add_tenant(&self, id: &str, shard: &str) -> i64 {
        let dba = self.dba().await;
        dba.execute(
            "INSERT INTO shard_directory.shard_directory (entity_type, entity_id, shard_name) VALUES ('tenant', $1, $2)",
            &[&id, &shard],
        )
        .await
        .expect("add tenant");
        dba.query_one("SELECT shard_directory.current_version()", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The DBA's move procedure without the row copy: directory steps plus the shards' fences.
    /// Returns the version of the cutover.
    pub async fn move_tenant(&self, id: &str, from: &str, to: &str) -> i64 {
        let dba = self.dba().await;
        let step = async |sql: &str| -> i64 {
            dba.query_one(sql, &[&id])
                .await
                .expect("directory step")
                .get(0)
        };
        dba.execute(
            "SELECT shard_directory.begin_move('tenant', $1, $2)",
            &[&id, &to],
        )
        .await
        .expect("begin_move");
        let source = self.shard(from).await;
        source
            .execute("SELECT shard_directory.fence_frozen('tenant', $1)", &[&id])
            .await
            .unwrap();
        step("SELECT shard_directory.freeze('tenant', $1)").await;
        let version = step("SELECT shard_directory.complete_move('tenant', $1)").await;
        source
            .execute(
                "SELECT shard_directory.fence_moved('tenant', $1, $2, $3)",
                &[&id, &to, &version],
            )
            .await
            .unwrap();
        self.shard(to)
            .await
            .execute(
                "SELECT shard_directory.fence_owned('tenant', $1, $2)",
                &[&id, &version],
            )
            .await
            .unwrap();
        version
    }

    /// Rows of `tenant` in `orders` on `shard`.
    pub async fn orders(&self, shard: &str, tenant: &str) -> Vec<String> {
        self.shard(shard)
            .await
            .query(
                "SELECT item FROM orders WHERE tenant_id = $1 ORDER BY item",
                &[&tenant],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}
