//! A throwaway PgBouncer in transaction mode in front of one cluster, on a free loopback port,
//! killed on drop.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cluster::{free_port, server_user};
use crate::Cluster;

pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Pools of `pool_size` server connections per database, in transaction mode, handed out in
    /// turn (`server_round_robin`): consecutive transactions of one client run on different
    /// server connections, so anything a client leaves on one (a prepared statement, a LISTEN)
    /// is not there next time.
    pub async fn start(cluster: &Cluster, pool_size: u32) -> PgBouncer {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from(format!(
            "/tmp/sd-pgbouncer-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the pgbouncer directory");
        let port = free_port();
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {dir}/users.txt\n\
             pool_mode = transaction\ndefault_pool_size = {pool_size}\nmin_pool_size = {pool_size}\n\
             server_round_robin = 1\nmax_client_conn = 200\n\
             logfile = {dir}/pgbouncer.log\n",
            cluster.port(),
            dir = dir.display()
        );
        fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
        fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("write users.txt");
        // Debian installs it in /usr/sbin, not always on a non-root PATH.
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut command = Command::new(program);
        command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // PgBouncer refuses root too: run it as the server's user, as this process's child.
        if let Some((uid, gid)) = server_user() {
            for file in ["", "pgbouncer.ini", "users.txt"] {
                std::os::unix::fs::chown(dir.join(file), Some(uid), Some(gid))
                    .expect("chown the pgbouncer directory");
            }
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .expect("start pgbouncer (scripts/setup.sh installs it)");
        let bouncer = PgBouncer { child, dir, port };
        crate::wait::accepting("pgbouncer", port).await;
        bouncer
    }

    /// Connection settings for `db` through this PgBouncer.
    pub fn config(&self, db: &str) -> tokio_postgres::Config {
        self.conn_str(db).parse().expect("valid connection string")
    }

    /// The same as a libpq-style connection string.
    pub fn conn_str(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("SD_KEEP_CLUSTERS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
