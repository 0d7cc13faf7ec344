//! The mover and its CLI over TLS: with `sslmode=require` in the directory's URL and the
//! registry's conninfo, every session the CLI opens is encrypted and verified against
//! `PGSSLROOTCERT`; without the roots it refuses to connect rather than go on in plain text.

use shard_directory_e2e::{mover_cli, Topology};

#[tokio::test]
async fn the_cli_moves_a_tenant_over_tls_and_refuses_an_unverified_server() {
    let t = Topology::start("tls").await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 3, 1).await;
    let mut roots = Vec::new();
    for cluster in std::iter::once(&t.directory).chain(t.shards.iter().map(|(_, c)| c)) {
        roots.extend(cluster.enable_tls().await);
        let admin = cluster.connect("postgres").await;
        for step in [
            "ALTER SYSTEM SET log_connections = on",
            "SELECT pg_reload_conf()",
        ] {
            admin.batch_execute(step).await.unwrap();
        }
    }
    let dba = t.dba().await;
    for (name, cluster) in &t.shards {
        dba.execute(
            "UPDATE shard_directory.shards SET conninfo = $2 WHERE shard_name = $1",
            &[
                name,
                &format!("{} sslmode=require", cluster.conn_str("app")),
            ],
        )
        .await
        .unwrap();
    }
    let bundle = std::env::temp_dir().join(format!("sd-tls-roots-{}.pem", std::process::id()));
    std::fs::write(&bundle, &roots).unwrap();
    let url = format!("{} sslmode=require", t.directory.conn_str("directory"));
    let run = |with_roots: bool| {
        let mut c = mover_cli::command(&t);
        c.env("SHARD_DIRECTORY_URL", &url);
        if with_roots {
            c.env("PGSSLROOTCERT", &bundle);
        } else {
            c.env_remove("PGSSLROOTCERT");
        }
        c.args(["move", "tenant", "a", "--to", "shard_2", "--method", "copy"]);
        c
    };
    let refused = run(false).output().await.unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("connect: directory") && stderr.contains("certificate"),
        "{stderr}"
    );
    let moved = run(true).output().await.unwrap();
    std::fs::remove_file(&bundle).unwrap();
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    assert_eq!(t.rows("shard_2", "a").await, (3, 3));
    for cluster in std::iter::once(&t.directory).chain(t.shards.iter().map(|(_, c)| c)) {
        let log = cluster.server_log();
        let sessions: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("connection authorized")
                    && l.contains("application_name=shard-directory")
            })
            .collect();
        assert!(
            !sessions.is_empty(),
            "{} saw no mover session",
            cluster.name()
        );
        assert!(
            sessions.iter().all(|l| l.contains("SSL enabled")),
            "{}: {sessions:#?}",
            cluster.name()
        );
    }
}
