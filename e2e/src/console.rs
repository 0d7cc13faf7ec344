//! `shard-directory console` run as an operator would, on a free port, and read over HTTP as a
//! browser does: pages, the server-sent events of the moves list, the metrics.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::mover_cli::command;
use crate::Topology;

/// A console process (killed on drop) and where it serves.
pub struct Console {
    process: tokio::process::Child,
    /// `host:port`.
    pub addr: String,
    /// The base path it was started with (`/console`, or empty).
    pub base: String,
    /// Served over HTTPS (`--tls-cert`): the certificate its requests trust (PEM).
    pub trust: Option<Vec<u8>>,
}

/// A connection to the console, over TLS or not.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A page as an HTTP response: its status and its body.
pub struct Page {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Console {
    /// Starts `shard-directory console --listen 127.0.0.1:0 --base-path <base> <extra>` on `t`'s
    /// directory, and waits for the address it prints.
    pub async fn start(t: &Topology, base: &str, extra: &[&str]) -> Console {
        Console::start_with(t, base, extra, &[]).await
    }

    /// [`Console::start`] with `env` (`NAME`, value) added to the command's environment.
    pub async fn start_with(
        t: &Topology,
        base: &str,
        extra: &[&str],
        env: &[(&str, &std::path::Path)],
    ) -> Console {
        let mut process = command(t)
            .args(["console", "--listen", "127.0.0.1:0", "--base-path", base])
            .args(extra)
            .envs(env.iter().copied())
            .env_remove("RUST_BACKTRACE")
            .kill_on_drop(true)
            .spawn()
            .expect("start the console");
        let stdout = process.stdout.take().expect("its stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the console prints its address within 30 s")
            .expect("read its stdout")
            .expect("a line");
        let url = line
            .strip_prefix("console: http://")
            .or_else(|| line.strip_prefix("console: https://"))
            .unwrap_or_else(|| panic!("not the console's address: {line}"));
        let addr = url.split('/').next().expect("host:port").to_owned();
        // Nothing more is printed; the rest of stdout is drained so it never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Console {
            process,
            addr,
            base: base.trim_end_matches('/').to_owned(),
            trust: None,
        }
    }

    /// Its requests made over TLS, trusting `cert` (PEM, issued to `localhost`).
    pub fn over_tls(mut self, cert: &[u8]) -> Console {
        self.trust = Some(cert.to_owned());
        self
    }

    /// A connection to it: over TLS (to `localhost`) when it serves HTTPS.
    async fn connect(&self) -> std::io::Result<Box<dyn Stream>> {
        let tcp = TcpStream::connect(&self.addr).await?;
        let Some(cert) = &self.trust else {
            return Ok(Box::new(tcp));
        };
        let root = native_tls::Certificate::from_pem(cert).expect("a PEM certificate");
        let connector = native_tls::TlsConnector::builder()
            .add_root_certificate(root)
            .build()
            .expect("a TLS connector");
        let connector = tokio_native_tls::TlsConnector::from(connector);
        let handshake = connector.connect("localhost", tcp);
        let tls = tokio::time::timeout(Duration::from_secs(30), handshake)
            .await
            .map_err(|_| std::io::Error::other("no TLS handshake within 30 s"))?
            .map_err(std::io::Error::other)?;
        Ok(Box::new(tls))
    }

    /// Asks the console to stop (SIGTERM) and waits for it, at most `within`: its exit code,
    /// `None` if it is still running then.
    pub async fn stop(mut self, within: Duration) -> Option<i32> {
        let pid = self.process.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let exited = tokio::time::timeout(within, self.process.wait()).await;
        exited
            .ok()
            .map(|status| status.expect("wait").code().unwrap_or(-1))
    }

    /// `GET <base><path>` with `headers` (each `Name: value`).
    pub async fn get_with(&self, path: &str, headers: &[&str]) -> Page {
        self.request("GET", path, headers, "").await
    }

    /// `POST <base><path>` of the form `body` (`a=1&b=2`) with `headers`.
    pub async fn post(&self, path: &str, headers: &[&str], body: &str) -> Page {
        let form = [
            "Content-Type: application/x-www-form-urlencoded".to_owned(),
            format!("Content-Length: {}", body.len()),
        ];
        let all: Vec<&str> = headers
            .iter()
            .copied()
            .chain(form.iter().map(String::as_str))
            .collect();
        self.request("POST", path, &all, body).await
    }

    async fn request(&self, method: &str, path: &str, headers: &[&str], body: &str) -> Page {
        let mut s = self.connect().await.expect("connect");
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let request = format!(
            "{method} {}{path} HTTP/1.0\r\nHost: {}\r\n{extra}\r\n{body}",
            self.base, self.addr
        );
        s.write_all(request.as_bytes()).await.expect("send");
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(60), s.read_to_string(&mut response))
            .await
            .expect("the page within 60 s")
            .expect("read the page");
        let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        Page {
            status,
            headers: head.to_owned(),
            body: body.to_owned(),
        }
    }

    pub async fn get(&self, path: &str) -> Page {
        self.get_with(path, &[]).await
    }

    /// The metrics' text.
    pub async fn metrics(&self) -> String {
        let page = self.get("/metrics").await;
        assert_eq!(page.status, 200, "{}", page.body);
        page.body
    }

    /// A watcher of `<base>/events`: one page's stream of server-sent events.
    pub async fn watch(&self) -> Events {
        self.watch_with("/events", &[]).await
    }

    /// A watcher of `<base><path>`, a stream of server-sent events, asked with `headers`.
    pub async fn watch_with(&self, path: &str, headers: &[&str]) -> Events {
        let mut s = self.connect().await.expect("connect");
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let request = format!(
            "GET {}{path} HTTP/1.0\r\nHost: {}\r\nAccept: text/event-stream\r\n{extra}\r\n",
            self.base, self.addr
        );
        s.write_all(request.as_bytes()).await.expect("send");
        let mut lines = BufReader::new(s).lines();
        // The head, up to its blank line.
        while let Some(line) = lines.next_line().await.expect("the head") {
            if line.is_empty() {
                break;
            }
        }
        Events { lines }
    }
}

/// A stream of server-sent events.
pub struct Events {
    lines: tokio::io::Lines<BufReader<Box<dyn Stream>>>,
}

impl Events {
    /// The next event's name and data (its `data:` lines joined), comments skipped.
    pub async fn next(&mut self) -> Option<(String, String)> {
        let (mut name, mut data) = (String::new(), Vec::new());
        while let Some(line) = self.lines.next_line().await.ok()? {
            if line.is_empty() {
                if !data.is_empty() {
                    return Some((name, data.join("\n")));
                }
                continue;
            }
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_owned();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
            }
        }
        None
    }

    /// Events until one whose data satisfies `done`, within `within`; every event's data, in
    /// order.
    pub async fn until(&mut self, within: Duration, done: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        let waited = tokio::time::timeout(within, async {
            while let Some((_, data)) = self.next().await {
                let found = done(&data);
                seen.push(data);
                if found {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            waited == Ok(true),
            "no such event within {within:?}; seen: {seen:#?}"
        );
        seen
    }
}
