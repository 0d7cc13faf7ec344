//! The console over TLS, at both ends as the rest of the CLI: it serves HTTPS itself
//! (`--tls-cert`, `--tls-key`), and reaches a directory that asks for TLS (`sslmode=require`,
//! verified against `PGSSLROOTCERT`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use shard_directory_e2e::console::Console;
use shard_directory_e2e::{mover_cli, Topology};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::console::TOKEN;

/// A self-signed certificate for `localhost` and its key (PKCS #8), written to `cert` and `key`.
pub(crate) fn certificate(cert: &Path, key: &Path) -> Vec<u8> {
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    std::fs::read(cert).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_serves_https_and_reaches_a_directory_over_tls() {
    let t = Topology::start("console-tls").await;
    t.add_tenant("s1", "shard_1").await;
    let root = t.directory.enable_tls().await;
    let roots = t.directory.scratch_path("directory-root.pem");
    std::fs::write(&roots, &root).unwrap();
    let (cert, key) = (
        t.directory.scratch_path("console.crt"),
        t.directory.scratch_path("console.key"),
    );
    let pem = certificate(&cert, &key);
    let users = t.directory.scratch_path("console-users");
    std::fs::write(&users, format!("alice:{TOKEN}\n")).unwrap();
    let url = format!("{} sslmode=require", t.directory.conn_str("directory"));
    let tls_args = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    // The directory's URL asks for TLS; the console's command is given the roots, as every
    // command of the CLI is (PGSSLROOTCERT).
    let args: Vec<&str> = ["--directory", url.as_str(), "--token-file"]
        .into_iter()
        .chain([users.to_str().unwrap()])
        .chain(tls_args)
        .collect();
    let env = [("PGSSLROOTCERT", roots.as_path())];
    let console = Console::start_with(&t, "", &args, &env)
        .await
        .over_tls(&pem);
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let tenant = console.get_with("/tenants/tenant/s1", &[&bearer]).await;
    assert_eq!(tenant.status, 200, "{}", tenant.body);
    assert!(
        tenant.body.contains("On <strong>shard_1</strong>"),
        "{}",
        tenant.body
    );
    // The live list read on its own session, over TLS too.
    let mut events = console.watch_with("/events", &[&bearer]).await;
    events
        .until(Duration::from_secs(30), |d| d.contains("Read at"))
        .await;
    let ssl: bool = t
        .directory
        .connect("postgres")
        .await
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'shard-directory console'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the console's directory session is encrypted");
    // The login cookie is for HTTPS only.
    let login = console.post("/login", &[], &format!("token={TOKEN}")).await;
    assert_eq!(login.status, 303);
    assert!(login.headers.contains("; Secure"), "{}", login.headers);
    // Plain HTTP to the HTTPS port gets no page.
    let mut plain = tokio::net::TcpStream::connect(&console.addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), plain.read_to_end(&mut answer)).await;
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1."),
        "{read:?}: {}",
        String::from_utf8_lossy(&answer)
    );
    // A client that opens a connection and never shakes hands holds up no other.
    let _silent = tokio::net::TcpStream::connect(&console.addr).await.unwrap();
    let fleet = console.get_with("/", &[&bearer]).await;
    assert_eq!(fleet.status, 200);

    // A key that is not the certificate's, or no file: refused at start, exit 2.
    let other = t.directory.scratch_path("other.key");
    certificate(&t.directory.scratch_path("other.crt"), &other);
    for (cert, key) in [
        (cert.to_str().unwrap(), other.to_str().unwrap()),
        ("/nonexistent.pem", key.to_str().unwrap()),
    ] {
        let started = mover_cli::command(&t)
            .args(["console", "--listen", "127.0.0.1:0"])
            .args(["--tls-cert", cert, "--tls-key", key])
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), started)
            .await
            .unwrap_or_else(|_| panic!("--tls-cert {cert} --tls-key {key}: served, not refused"))
            .unwrap();
        let stderr = mover_cli::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--tls-"), "{stderr}");
    }
}
