//! What an operator reads in the relay's log (the mover's is the same: both connect through
//! `shard-directory-connect`): why a session ended, as the mover says it (the step, the place,
//! the server's own words; tokio-postgres's text names only the kind of error), and a server's
//! NOTICE or WARNING as tokio-postgres's own connection future logs it (`info`, target
//! `tokio_postgres::connection`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A tracing subscriber for this thread writing into the returned buffer.
fn capture() -> (Buf, tracing::subscriber::DefaultGuard) {
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// What the relay logs in its first 300 ms against the directory on `port`.
async fn logged_against(port: u16) -> String {
    let config: tokio_postgres::Config =
        format!("host=127.0.0.1 port={port} user=u dbname=d sslmode=disable")
            .parse()
            .unwrap();
    let (logged, _guard) = capture();
    let options = shard_directory_relay::RelayOptions {
        redis: "redis://127.0.0.1:1/".into(),
        channel: "c".into(),
        key: b"k".to_vec(),
        heartbeat: Duration::from_secs(1),
    };
    let relayed = shard_directory_relay::relay(&config, &options);
    let _ = tokio::time::timeout(Duration::from_millis(300), relayed).await;
    logged.text()
}

#[tokio::test]
async fn a_directory_nobody_listens_on_is_named_with_the_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let logged = logged_against(port).await;
    assert!(
        logged.contains(
            "error=connect: directory: error connecting to server: Connection refused (os error 111)"
        ),
        "{logged}"
    );
}

/// A server that refuses every login: FATAL 28P01.
async fn refusing_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let len = s.read_i32().await.unwrap() as usize;
                let mut startup = vec![0; len - 4];
                s.read_exact(&mut startup).await.unwrap();
                let body =
                    b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"u\"\0\0";
                let mut m = vec![b'E'];
                m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
                m.extend_from_slice(body);
                let _ = s.write_all(&m).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_directory_refusing_the_login_is_named_with_its_sqlstate() {
    let logged = logged_against(refusing_server().await).await;
    assert!(
        logged.contains(
            "error=connect: directory: password authentication failed for user \"u\" (28P01)"
        ),
        "{logged}"
    );
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// Just enough of a PostgreSQL server: trust auth; every simple query answered with a NOTICE,
/// then "SET" and ready.
async fn serve(mut s: TcpStream) {
    let len = s.read_i32().await.unwrap() as usize;
    let mut startup = vec![0; len - 4];
    s.read_exact(&mut startup).await.unwrap();
    let mut out = message(b'R', &0i32.to_be_bytes());
    out.extend(message(b'Z', b"I"));
    s.write_all(&out).await.unwrap();
    loop {
        let Ok(kind) = s.read_u8().await else { return };
        let len = s.read_i32().await.unwrap() as usize;
        let mut body = vec![0; len - 4];
        s.read_exact(&mut body).await.unwrap();
        match kind {
            b'Q' => {
                let notice = b"SNOTICE\0VNOTICE\0C00000\0Mhello from the server\0\0";
                let mut out = message(b'N', notice);
                out.extend(message(b'C', b"SET\0"));
                out.extend(message(b'Z', b"I"));
                s.write_all(&out).await.unwrap();
            }
            b'X' => return,
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_server_notice_is_logged_as_tokio_postgres_logs_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve(s));
        }
    });
    let (logged, _guard) = capture();
    let config: tokio_postgres::Config =
        format!("host=127.0.0.1 port={port} user=u dbname=d sslmode=disable")
            .parse()
            .unwrap();
    let _client = shard_directory_connect::connect(&config, "notices")
        .await
        .unwrap();
    let wanted = "INFO tokio_postgres::connection: NOTICE: hello from the server";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let logged = logged.text();
        if logged.contains(wanted) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logged}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
