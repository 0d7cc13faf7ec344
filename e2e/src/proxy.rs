//! A TCP proxy in front of a cluster. It can turn into a black hole: it accepts connections and
//! never answers, as a load balancer or proxy whose backend is gone does (the kernel's TCP
//! connect succeeds; PostgreSQL's startup never completes). It can cut the connections it
//! carries on the client's side only, as a network blip does: the server keeps its sessions (and
//! their locks) until it finds out. It can pause them, bytes held and both ends open, as a
//! network partition does: neither side hears of it for minutes. And it can strand them for good
//! while new connections pass, as a lost NAT entry or load balancer flow does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    port: u16,
    forwarding: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    paused: watch::Sender<bool>,
    stranded: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream` (a port of the loopback), in black-hole mode until
    /// [`Proxy::forward`].
    pub async fn black_hole(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let port = listener.local_addr().unwrap().port();
        let forwarding = Arc::new(AtomicBool::new(false));
        let (cut, cuts) = watch::channel(0u64);
        let (paused, pauses) = watch::channel(false);
        let (stranded, strands) = watch::channel(0u64);
        // Server sides of connections cut on the client's side: kept open, as the server sees it.
        let kept: Arc<Mutex<Vec<OwnedWriteHalf>>> = Arc::default();
        let mode = forwarding.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let forward = mode.load(Ordering::SeqCst);
                let (mut cuts, pauses, kept) = (cuts.clone(), pauses.clone(), kept.clone());
                let mut strands = strands.clone();
                cuts.mark_unchanged();
                strands.mark_unchanged();
                tokio::spawn(async move {
                    if !forward {
                        // Read what the client sends, answer nothing, until it hangs up.
                        let mut sink = [0u8; 1024];
                        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
                        return;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let ((from_client, to_client), (from_server, mut to_server)) =
                        (client.into_split(), server.into_split());
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                pump(from_client, &mut to_server, pauses.clone(), strands.clone()),
                                pump(from_server, to_client, pauses, strands),
                            )
                        } => {}
                        _ = cuts.changed() => kept.lock().unwrap().push(to_server),
                    }
                });
            }
        });
        Proxy {
            port,
            forwarding,
            cut,
            paused,
            stranded,
            task,
        }
    }

    /// A proxy that forwards from the start.
    pub async fn forwarding(upstream: u16) -> Proxy {
        let proxy = Proxy::black_hole(upstream).await;
        proxy.forward();
        proxy
    }

    /// From now on, new connections reach the upstream (those held in the black hole stay).
    pub fn forward(&self) {
        self.forwarding.store(true, Ordering::SeqCst);
    }

    /// Closes every forwarded connection on the client's side, keeping the server's side open
    /// (for as long as the proxy lives): a blip the server does not see.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Holds (`true`) or passes again (`false`) every byte of the forwarded connections, new
    /// ones too, both ends kept open: a partition neither end is told of.
    pub fn pause(&self, on: bool) {
        self.paused.send_replace(on);
    }

    /// Holds every connection carried now for good, both ends open and nothing passing, while
    /// new connections pass: neither end of a stranded one hears of it.
    pub fn strand(&self) {
        self.stranded.send_modify(|n| *n += 1);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `cluster`'s connection string for `db`, through this proxy.
    pub fn conn_str(&self, cluster: &crate::Cluster, db: &str) -> String {
        cluster.conn_str(db).replace(
            &format!("port={}", cluster.port()),
            &format!("port={}", self.port),
        )
    }
}

/// Copies `from` to `to`, holding what it reads while `paused` says so, and for good once
/// `stranded` changes; `to` is shut down when `from` ends, so the other end hears of it, unless
/// stranded.
async fn pump<W: AsyncWriteExt + Unpin>(
    mut from: OwnedReadHalf,
    mut to: W,
    mut paused: watch::Receiver<bool>,
    stranded: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = from.read(&mut buf).await;
        if stranded.has_changed().unwrap_or(false) {
            let _open = (from, to);
            return std::future::pending().await;
        }
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if paused.wait_for(|p| !*p).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
