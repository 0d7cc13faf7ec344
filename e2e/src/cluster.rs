use std::collections::HashMap;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

/// One PostgreSQL cluster in a temporary directory, with `shard_directory` available.
pub struct Cluster {
    name: String,
    root: PathBuf,
    port: u16,
    install: &'static Install,
}

/// A connection whose notifications arrive on `notifications`.
pub struct Listener {
    pub client: Client,
    pub notifications: mpsc::UnboundedReceiver<Notification>,
}

/// A PostgreSQL installation, known by its `pg_config`: where a cluster's programs come from and
/// where the extension must be installed for it.
pub struct Install {
    pg_config: PathBuf,
    bindir: PathBuf,
}

impl Install {
    /// The one `PG_CONFIG` names, Debian's PostgreSQL 15 by default: what every cluster runs
    /// unless a test asks for a major.
    pub fn configured() -> &'static Install {
        static CONFIGURED: OnceLock<&'static Install> = OnceLock::new();
        CONFIGURED.get_or_init(|| {
            Install::at(std::env::var_os("PG_CONFIG").map_or_else(
                || PathBuf::from("/usr/lib/postgresql/15/bin/pg_config"),
                PathBuf::from,
            ))
        })
    }

    /// PostgreSQL `major`: Debian's 15, or the tree `scripts/setup.sh` unpacked under `.pg/`.
    pub fn major(major: u32) -> &'static Install {
        static BY_MAJOR: OnceLock<std::sync::Mutex<HashMap<u32, &'static Install>>> =
            OnceLock::new();
        let mut known = BY_MAJOR.get_or_init(Default::default).lock().unwrap();
        known.entry(major).or_insert_with(|| {
            Install::at(if major == 15 {
                PathBuf::from("/usr/lib/postgresql/15/bin/pg_config")
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../.pg/{major}/bin/pg_config"))
            })
        })
    }

    fn at(pg_config: PathBuf) -> &'static Install {
        assert!(
            pg_config.exists(),
            "{} is missing: run bash scripts/setup.sh",
            pg_config.display()
        );
        let mut install = Install {
            pg_config,
            bindir: PathBuf::new(),
        };
        install.bindir = install.dir("--bindir");
        Box::leak(Box::new(install))
    }

    /// Its PostgreSQL major, as `pg_config --version` says.
    pub fn server_major(&self) -> i32 {
        let out = Command::new(&self.pg_config)
            .arg("--version")
            .output()
            .expect("run pg_config --version");
        let version = String::from_utf8_lossy(&out.stdout);
        version
            .trim()
            .strip_prefix("PostgreSQL ")
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|major| major.parse().ok())
            .unwrap_or_else(|| panic!("pg_config --version said {version:?}"))
    }

    /// A directory `pg_config` reports (`--sharedir`, `--pkglibdir`, ...).
    fn dir(&self, flag: &str) -> PathBuf {
        let out = Command::new(&self.pg_config)
            .arg(flag)
            .output()
            .expect("run pg_config");
        assert!(out.status.success(), "pg_config {flag} failed");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// One of its programs.
    fn program(&self, program: &str) -> PathBuf {
        self.bindir.join(program)
    }

    /// Server-side programs run as `postgres` when we are root: PostgreSQL refuses root. The
    /// server must not inherit RUST_BACKTRACE: pgrx would append backtraces to error DETAILs.
    fn server_command(&self, program: &str) -> Command {
        let path = self.program(program);
        let mut c = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        c.env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE");
        c
    }
}

fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        let out = Command::new("id").arg("-u").output().expect("run id -u");
        String::from_utf8_lossy(&out.stdout).trim() == "0"
    })
}

/// The uid and gid of `postgres`, when we are root and server-side programs must run as it.
pub(crate) fn server_user() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = run(
            {
                let mut c = Command::new("id");
                c.args([flag, "postgres"]);
                c
            },
            "id postgres",
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    Some((id("-u"), id("-g")))
}

fn run(mut cmd: Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .unwrap()
        .port()
}

fn pg_ctl_start(install: &Install, root: &Path, port: u16) -> bool {
    let mut pg_ctl = install.server_command("pg_ctl");
    pg_ctl
        .args(["-w", "-t", "60", "-D"])
        .arg(root.join("data"))
        .arg("-l")
        .arg(root.join("server.log"))
        .args(["-o", &format!("-p {port}")])
        .arg("start");
    pg_ctl.output().expect("run pg_ctl start").status.success()
}

/// A fresh directory for a cluster named `name`, owned by the server's user.
fn cluster_root(name: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let root = PathBuf::from(format!(
        "/tmp/sd-{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).expect("create cluster directory");
    if is_root() {
        run(
            {
                let mut c = Command::new("chown");
                c.arg("postgres:").arg(&root);
                c
            },
            "chown cluster directory",
        );
    }
    root
}

/// Appends `conf` to `root`'s postgresql.conf (later lines win); appending keeps the file owned
/// by the server's user, and root may write it.
fn append_conf(root: &Path, conf: &str) {
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(root.join("data/postgresql.conf"))
        .expect("open postgresql.conf");
    std::io::Write::write_all(&mut file, conf.as_bytes()).expect("write postgresql.conf");
}

/// Starts the cluster in `root` on a free port. Another process may grab the port between bind
/// and start: a few are tried.
fn start_on_a_free_port(install: &'static Install, name: &str, root: PathBuf) -> Cluster {
    for attempt in 0..5 {
        let port = free_port();
        if pg_ctl_start(install, &root, port) {
            return Cluster {
                name: name.to_owned(),
                root,
                port,
                install,
            };
        }
        eprintln!(
            "cluster {name}: start on port {port} failed (attempt {attempt}): {}",
            fs::read_to_string(root.join("server.log")).unwrap_or_default()
        );
    }
    panic!("cluster {name}: could not start PostgreSQL");
}

impl Cluster {
    /// initdb + start, from [`Install::configured`]. `settings` go into postgresql.conf (e.g.
    /// `shared_preload_libraries`).
    pub fn start(name: &str, settings: &[(&str, &str)]) -> Cluster {
        Cluster::start_from(Install::configured(), name, settings)
    }

    /// [`Cluster::start`], from the binaries of `install`.
    pub fn start_from(install: &'static Install, name: &str, settings: &[(&str, &str)]) -> Cluster {
        let control = install
            .dir("--sharedir")
            .join("extension/shard_directory.control");
        assert!(
            control.exists(),
            "{} is missing: install the extension first (bash scripts/install-extension.sh)",
            control.display()
        );
        let root = cluster_root(name);
        let data = root.join("data");
        let mut initdb = install.server_command("initdb");
        initdb
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(&data);
        run(initdb, "initdb");

        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\n\
             synchronous_commit = off\nfull_page_writes = off\nmax_connections = 60\n\
             shared_buffers = 32MB\n",
            root.display()
        );
        for (k, v) in settings {
            conf.push_str(&format!("{k} = '{v}'\n"));
        }
        append_conf(&root, &conf);
        start_on_a_free_port(install, name, root)
    }

    /// A streaming standby of this cluster (`pg_basebackup -R`), started, on a port of its own.
    pub fn standby(&self, name: &str) -> Cluster {
        let root = cluster_root(name);
        self.standby_data(&root);
        start_on_a_free_port(self.install, name, root)
    }

    /// A standby's data directory in `root`, from this server.
    fn standby_data(&self, root: &Path) {
        self.pg_basebackup(&root.join("data"), &["-R"]);
        // Its replay position reaches the primary within a second (pg_stat_replication).
        append_conf(
            root,
            &format!(
                "unix_socket_directories = '{}'\nwal_receiver_status_interval = 1\n",
                root.display()
            ),
        );
    }

    /// Ends a standby's recovery: from now on it is a primary, on a timeline of its own.
    pub fn promote(&self) {
        let mut pg_ctl = self.install.server_command("pg_ctl");
        pg_ctl
            .args(["-w", "-D"])
            .arg(self.root.join("data"))
            .arg("promote");
        run(pg_ctl, "pg_ctl promote");
    }

    /// A failover behind an address that moves (a virtual IP, a DNS name): this server, its
    /// primary crashed, the promoted standby `promoted` stopped, and its data directory put in
    /// place of this one's, started again at this server's address. Clients then meet a new
    /// timeline where they knew the old primary.
    pub fn take_over(&self, promoted: &Cluster) {
        promoted.stop();
        let data = self.root.join("data");
        fs::remove_dir_all(&data).expect("remove the data directory");
        copy_tree(&promoted.root.join("data"), &data);
        append_conf(
            &self.root,
            &format!("unix_socket_directories = '{}'\n", self.root.display()),
        );
        self.restart();
    }

    /// This server made again as a streaming standby of `primary` (`pg_basebackup -R`), on the
    /// same port, whether it was running or not: a standby rebuilt.
    pub fn follow(&self, primary: &Cluster) {
        let _ = self.immediate_stop().output();
        let data = self.root.join("data");
        fs::remove_dir_all(&data).expect("remove the data directory");
        primary.standby_data(&self.root);
        self.restart();
    }

    /// Whether the server runs (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut pg_ctl = self.install.server_command("pg_ctl");
        pg_ctl.arg("-D").arg(self.root.join("data")).arg("status");
        pg_ctl.output().is_ok_and(|o| o.status.success())
    }

    /// Stops the server (fast shutdown: sessions are disconnected), keeping its data.
    pub fn stop(&self) {
        let mut pg_ctl = self.install.server_command("pg_ctl");
        pg_ctl
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.root.join("data"))
            .arg("stop");
        run(pg_ctl, "pg_ctl stop");
    }

    /// Stops the server as a DBA does: fast, then immediate when that has not ended within 20 s
    /// (a fast shutdown waits for its standbys to confirm the shutdown checkpoint, which one
    /// that diverged from it never does).
    pub fn stop_or_crash(&self) {
        let mut pg_ctl = self.install.server_command("pg_ctl");
        pg_ctl
            .args(["-w", "-t", "20", "-m", "fast", "-D"])
            .arg(self.root.join("data"))
            .arg("stop");
        if !pg_ctl.output().is_ok_and(|o| o.status.success()) {
            self.crash();
        }
    }

    /// Stops the server as a crash would (immediate shutdown: no checkpoint, sessions cut).
    pub fn crash(&self) {
        run(self.immediate_stop(), "pg_ctl stop -m immediate");
    }

    fn immediate_stop(&self) -> Command {
        let mut pg_ctl = self.install.server_command("pg_ctl");
        pg_ctl
            .args(["-w", "-m", "immediate", "-D"])
            .arg(self.root.join("data"))
            .arg("stop");
        pg_ctl
    }

    /// Starts a stopped server again, on the same port.
    pub fn restart(&self) {
        assert!(
            pg_ctl_start(self.install, &self.root, self.port),
            "cluster {}: restart failed:\n{}",
            self.name,
            self.server_log()
        );
    }

    /// Stops the server ([`Cluster::stop_or_crash`]), copies its data directory as it is (`cp -a`:
    /// the files stay the server's user's), and starts it again on the same port: a cold backup,
    /// for [`Cluster::restore_cold_copy`]. Kept in the cluster's folder, removed with it.
    pub fn cold_copy(&self) -> ColdCopy {
        let copy = self.copy_path("cold");
        self.stop_or_crash();
        copy_tree(&self.root.join("data"), &copy);
        self.restart();
        ColdCopy(copy)
    }

    /// A base backup of the running server (`pg_basebackup -X stream`, no restart): put back
    /// with [`Cluster::restore_cold_copy`], it starts at the backup's end, in the same lineage
    /// as whatever the server made after it.
    pub fn base_backup(&self) -> ColdCopy {
        let copy = self.copy_path("base");
        self.pg_basebackup(&copy, &[]);
        ColdCopy(copy)
    }

    /// `pg_basebackup -X stream` of this server into `to`, with `more` options.
    fn pg_basebackup(&self, to: &Path, more: &[&str]) {
        let mut backup = self.install.server_command("pg_basebackup");
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-X", "stream", "--no-sync", "-c", "fast"])
            .args(more)
            .arg("-D")
            .arg(to);
        run(backup, "pg_basebackup");
    }

    /// A new place for a copy of the data directory, in the cluster's folder.
    fn copy_path(&self, kind: &str) -> PathBuf {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        self.root
            .join(format!("{kind}-{}", SEQ.fetch_add(1, Ordering::Relaxed)))
    }

    /// Stops the server and puts `copy` in place of its data directory: every commit since the
    /// copy is lost, as when a DBA restores a cold backup. Not started again
    /// ([`Cluster::restore_cold_copy`] does); [`Cluster::single_user_sql`] may run meanwhile.
    pub fn put_back_cold_copy(&self, copy: &ColdCopy) {
        self.stop_or_crash();
        let data = self.root.join("data");
        fs::remove_dir_all(&data).expect("remove the data directory");
        copy_tree(&copy.0, &data);
    }

    /// [`Cluster::put_back_cold_copy`], then starts the server again on the same port.
    pub fn restore_cold_copy(&self, copy: &ColdCopy) {
        self.put_back_cold_copy(copy);
        self.restart();
    }

    /// Runs `statements` (one per line) on `db` with the server itself, single-user, on the
    /// stopped cluster's data directory: a change made before any client can connect. Panics
    /// with the output when a statement fails.
    pub fn single_user_sql(&self, db: &str, statements: &str) {
        let mut postgres = self.single_user(db, &[]);
        postgres
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = postgres.spawn().expect("run postgres --single");
        let mut stdin = child.stdin.take().expect("its stdin");
        std::io::Write::write_all(&mut stdin, statements.as_bytes()).expect("write statements");
        drop(stdin);
        let out = child.wait_with_output().expect("postgres --single");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && !said.contains("ERROR:") && !said.contains("FATAL:"),
            "postgres --single on {}: {said}",
            self.name
        );
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Freezes every process of the cluster with SIGSTOP: it accepts nothing and answers
    /// nothing, as a server behind a link that silently drops packets. Thawed (SIGCONT) when the
    /// guard drops, also when a test fails.
    pub fn freeze(&self) -> Frozen<'_> {
        let pid = self.postmaster_pid().to_string();
        signal("-STOP", &pid);
        signal_children("-STOP", &pid);
        Frozen {
            pid,
            _cluster: self,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn postmaster_pid(&self) -> u32 {
        fs::read_to_string(self.root.join("data/postmaster.pid"))
            .expect("postmaster.pid")
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid on the first line of postmaster.pid")
    }

    /// CPU time (user and system) used so far by each of the server's processes alive now (the
    /// postmaster and its children: backends, WAL writer, ...).
    pub fn cpu_times(&self) -> CpuTimes {
        let postmaster = self.postmaster_pid().to_string();
        let pids = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
        CpuTimes(
            pids.filter_map(|pid| {
                let f = proc_stat(pid)?;
                (pid.to_string() == postmaster || f[1] == postmaster).then(|| (pid, ticks(&f)))
            })
            .collect(),
        )
    }

    /// libpq-style connection string (also what `psql` and the client crate take).
    pub fn conn_str(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    pub fn config(&self, db: &str) -> Config {
        self.conn_str(db).parse().expect("valid connection string")
    }

    /// A connection whose driver task runs on the current tokio runtime.
    pub async fn connect(&self, db: &str) -> Client {
        let (client, connection) = self.config(db).connect(NoTls).await.expect("connect");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// A connection as `role` (one with LOGIN), whose driver task runs on the current tokio
    /// runtime.
    pub async fn connect_as(&self, db: &str, role: &str) -> Client {
        let mut config = self.config(db);
        config.user(role);
        let (client, connection) = config.connect(NoTls).await.expect("connect");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// How many server processes died of a signal so far (the server log's "terminated by
    /// signal"): each one made the postmaster end every backend and recover.
    pub fn crashes(&self) -> usize {
        self.server_log()
            .matches("was terminated by signal")
            .count()
    }

    /// A connection that forwards the notifications it receives.
    pub async fn connect_listening(&self, db: &str) -> Listener {
        let (client, mut connection) = self.config(db).connect(NoTls).await.expect("connect");
        let (tx, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(msg)) = messages.next().await {
                if let AsyncMessage::Notification(n) = msg {
                    let _ = tx.send(n);
                }
            }
        });
        Listener {
            client,
            notifications,
        }
    }

    /// Turns `ssl = on` with a self-signed certificate for `127.0.0.1` made for this cluster;
    /// returns the certificate (PEM), for a client to trust. Plaintext connections still work
    /// (the harness's own).
    pub async fn enable_tls(&self) -> Vec<u8> {
        let data = self.root.join("data");
        let (cert, key) = (data.join("server.crt"), data.join("server.key"));
        let mut openssl = Command::new("openssl");
        openssl
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert);
        run(openssl, "openssl req (a self-signed certificate)");
        if let Some((uid, gid)) = server_user() {
            for file in [&cert, &key] {
                std::os::unix::fs::chown(file, Some(uid), Some(gid))
                    .expect("chown the certificate");
            }
        }
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod the key");
        let admin = self.connect("postgres").await;
        for step in ["ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"] {
            admin.batch_execute(step).await.expect("turn ssl on");
        }
        crate::eventually(
            "the server to reload with ssl on",
            Duration::from_secs(10),
            || async {
                let on: String = self
                    .connect("postgres")
                    .await
                    .query_one("SHOW ssl", &[])
                    .await
                    .ok()?
                    .get(0);
                (on == "on").then_some(())
            },
        )
        .await;
        fs::read(&cert).expect("read the certificate")
    }

    /// Makes the server ask `role` for its password (SCRAM) on TCP connections, replication
    /// ones too; every other role keeps `trust`.
    pub async fn require_password(&self, role: &str) {
        let hba = self.root.join("data/pg_hba.conf");
        let rules = fs::read_to_string(&hba).expect("read pg_hba.conf");
        let first = format!(
            "host all {role} 127.0.0.1/32 scram-sha-256\n\
             host replication {role} 127.0.0.1/32 scram-sha-256\n"
        );
        // Rewriting in place keeps the file owned by the server's user.
        fs::write(&hba, first + &rules).expect("write pg_hba.conf");
        self.connect("postgres")
            .await
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload");
    }

    /// Creates `db` with `shard_directory` installed in it.
    pub async fn create_database_with_extension(&self, db: &str) {
        let admin = self.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{db}\""))
            .await
            .expect("create database");
        let client = self.connect(db).await;
        client
            .batch_execute("CREATE EXTENSION shard_directory")
            .await
            .expect("create extension");
    }

    /// A PostgreSQL client program (`createdb`, `pgbench`, `psql`, ...) pointed at this cluster.
    pub fn client_command(&self, program: &str) -> Command {
        let mut c = Command::new(self.install.program(program));
        c.args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-p",
            &self.port.to_string(),
        ]);
        c
    }

    /// Runs one `pg_regress` test against this cluster, in a new database named after it;
    /// returns whether it passed and its report (with the diffs when it did not).
    pub fn pg_regress(&self, input_dir: &Path, output_dir: &Path, test: &str) -> (bool, String) {
        let pg_regress = self
            .install
            .dir("--pkglibdir")
            .join("pgxs/src/test/regress/pg_regress");
        fs::create_dir_all(output_dir).expect("create pg_regress output dir");
        // with --use-existing, pg_regress expects its database to be there
        let mut createdb = self.client_command("createdb");
        createdb.arg(test);
        run(createdb, "createdb");
        let out = Command::new(pg_regress)
            .arg("--use-existing")
            .arg(format!("--bindir={}", self.install.bindir.display()))
            .arg(format!("--inputdir={}", input_dir.display()))
            .arg(format!("--outputdir={}", output_dir.display()))
            .args(["--host=127.0.0.1", "--user=postgres"])
            .arg(format!("--dbname={test}"))
            .arg(format!("--port={}", self.port))
            .arg(test)
            .output()
            .expect("run pg_regress");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            text.push_str(
                &fs::read_to_string(output_dir.join("regression.diffs")).unwrap_or_default(),
            );
        }
        (out.status.success(), text)
    }

    /// A path inside the cluster's folder (removed with it), for files a test writes: a dump.
    pub fn scratch_path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The server itself, single-user (`postgres --single`), on this cluster's data directory
    /// and `db`, run under `wrapper` (`valgrind --tool=callgrind ...`, say) when given. The
    /// cluster must be stopped; statements go to its stdin, one per line.
    pub fn single_user(&self, db: &str, wrapper: &[&str]) -> Command {
        let postgres = self.install.program("postgres");
        let mut c = match (is_root(), wrapper.split_first()) {
            (true, _) => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"])
                    .args(wrapper)
                    .arg(&postgres);
                c
            }
            (false, Some((program, args))) => {
                let mut c = Command::new(program);
                c.args(args).arg(&postgres);
                c
            }
            (false, None) => Command::new(&postgres),
        };
        c.arg("--single")
            .arg("-D")
            .arg(self.root.join("data"))
            .arg(db)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE");
        c
    }

    /// The server log, for diagnosing a failure.
    pub fn server_log(&self) -> String {
        fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }
}

/// A copy of a cluster's data directory ([`Cluster::cold_copy`], [`Cluster::base_backup`]).
pub struct ColdCopy(PathBuf);

/// `cp -a from to`: ownership and modes kept (the server refuses a data directory it does not
/// own, or one open to others).
fn copy_tree(from: &Path, to: &Path) {
    let mut cp = Command::new("cp");
    cp.arg("-a").arg(from).arg(to);
    run(cp, "cp -a (a data directory)");
}

/// A cluster frozen by [`Cluster::freeze`]; thawed on drop.
pub struct Frozen<'a> {
    pid: String,
    _cluster: &'a Cluster,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        signal_children("-CONT", &self.pid);
        signal("-CONT", &self.pid);
    }
}

fn signal(sig: &str, pid: &str) {
    let _ = Command::new("kill").args([sig, pid]).status();
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, ...
fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    Some(after_name.split(' ').map(str::to_owned).collect())
}

/// utime and stime of a `/proc/<pid>/stat`, in clock ticks of 1/100 s (USER_HZ on Linux).
fn ticks(stat: &[String]) -> u64 {
    stat[11].parse::<u64>().unwrap_or(0) + stat[12].parse::<u64>().unwrap_or(0)
}

/// CPU time (user and system, all threads) each process had used when read.
pub struct CpuTimes(std::collections::HashMap<u32, u64>);

impl CpuTimes {
    /// Of the processes `pids` that are alive.
    pub fn of(pids: impl IntoIterator<Item = u32>) -> CpuTimes {
        CpuTimes(
            pids.into_iter()
                .filter_map(|pid| Some((pid, ticks(&proc_stat(pid)?))))
                .collect(),
        )
    }

    /// The CPU time used between `before` and these readings, process by process: a process
    /// that ended meanwhile is left out, one that started is counted whole.
    pub fn since(&self, before: &CpuTimes) -> Duration {
        let ticks: u64 = self
            .0
            .iter()
            .map(|(pid, now)| now.saturating_sub(before.0.get(pid).copied().unwrap_or(0)))
            .sum();
        Duration::from_millis(ticks * 10)
    }
}

fn signal_children(sig: &str, parent: &str) {
    let _ = Command::new("pkill").args([sig, "-P", parent]).status();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.immediate_stop().output();
        if std::env::var_os("SD_KEEP_CLUSTERS").is_none() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// Makes `standby` (a connection to a standby of `primary`'s server) stop replaying, 2 MB of WAL
/// behind (a table `junk` written on `primary`), and replay again a second later, in the
/// background; `resumed` says when. For a pace that waits on standbys' replay lag.
pub async fn lag_for_a_second(
    standby: std::sync::Arc<Client>,
    primary: &Client,
    resumed: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
) {
    standby
        .batch_execute("SELECT pg_wal_replay_pause()")
        .await
        .unwrap();
    primary
        .batch_execute(
            "CREATE TABLE junk AS SELECT repeat('x', 1000) FROM generate_series(1, 2000)",
        )
        .await
        .unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        *resumed.lock().unwrap() = Some(std::time::Instant::now());
        standby
            .batch_execute("SELECT pg_wal_replay_resume()")
            .await
            .unwrap();
    });
}
