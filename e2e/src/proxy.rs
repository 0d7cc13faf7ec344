//! A TCP proxy in front of a cluster that can turn into a black hole: it accepts connections and
//! never answers, as a load balancer or proxy whose backend is gone does (the kernel's TCP
//! connect succeeds; PostgreSQL's startup never completes).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

pub struct Proxy {
    port: u16,
    forwarding: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream` (a port of the loopback), in black-hole mode until
    /// [`Proxy::forward`].
    pub async fn black_hole(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let port = listener.local_addr().unwrap().port();
        let forwarding = Arc::new(AtomicBool::new(false));
        let mode = forwarding.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let forward = mode.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if forward {
                        if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    } else {
                        // Read what the client sends, answer nothing, until it hangs up.
                        let mut sink = [0u8; 1024];
                        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                });
            }
        });
        Proxy {
            port,
            forwarding,
            task,
        }
    }

    /// From now on, new connections reach the upstream (those held in the black hole stay).
    pub fn forward(&self) {
        self.forwarding.store(true, Ordering::SeqCst);
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
