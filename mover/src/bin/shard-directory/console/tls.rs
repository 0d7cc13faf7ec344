//! `--tls-cert` and `--tls-key`: the console served over HTTPS, by the TLS library the CLI's
//! connections use (native-tls: OpenSSL here). Each handshake runs apart from the accept loop,
//! within a bound, so that a client that never finishes one holds up no other.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_native_tls::{TlsAcceptor, TlsStream};

/// How long a client may take over its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// The acceptor of `cert` (PEM, the chain from the server's certificate up) and `key` (PEM,
/// PKCS #8), or what is wrong with them: checked by a handshake with itself, since a key that
/// is not the certificate's reads well and fails only then.
pub async fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let read =
        |p: &Path, flag: &str| std::fs::read(p).map_err(|e| format!("{flag} {}: {e}", p.display()));
    let identity =
        native_tls::Identity::from_pkcs8(&read(cert, "--tls-cert")?, &read(key, "--tls-key")?)
            .map_err(|e| {
                format!(
                    "--tls-cert {} with --tls-key {}: {e} (PEM files, the key PKCS #8: \
             `openssl pkcs8 -topk8 -nocrypt` converts one)",
                    cert.display(),
                    key.display()
                )
            })?;
    let acceptor = native_tls::TlsAcceptor::new(identity).map_err(|e| format!("TLS: {e}"))?;
    let acceptor = TlsAcceptor::from(acceptor);
    shake_hands(&acceptor).await.map_err(|e| {
        format!(
            "--tls-cert {} with --tls-key {}: a handshake with them fails ({e}): is the key \
             the certificate's?",
            cert.display(),
            key.display()
        )
    })?;
    Ok(acceptor)
}

/// A handshake of `acceptor` with a client in this process that takes any certificate: only the
/// server's side (its key signs for its certificate) is tried.
async fn shake_hands(acceptor: &TlsAcceptor) -> Result<(), String> {
    let connector = native_tls::TlsConnector::builder()
        .danger_accept_invalid_certs(true)
        .danger_accept_invalid_hostnames(true)
        .build()
        .map_err(|e| e.to_string())?;
    let connector = tokio_native_tls::TlsConnector::from(connector);
    let (client, server) = tokio::io::duplex(64 * 1024);
    let shaken = tokio::time::timeout(
        HANDSHAKE_WITHIN,
        futures_util::future::try_join(
            async { acceptor.accept(server).await.map_err(|e| e.to_string()) },
            async {
                let connected = connector.connect("localhost", client).await;
                connected.map_err(|e| e.to_string())
            },
        ),
    )
    .await;
    match shaken {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no handshake within {HANDSHAKE_WITHIN:?}")),
    }
}

/// Connections that finished their handshake, for `axum::serve`.
pub struct TlsListener {
    done: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, done) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait, as axum's own listener does.
                        tracing::warn!("the console's accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "a TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "a TLS handshake took too long"),
                    }
                });
            }
        });
        Ok(TlsListener { done, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.done.recv().await {
            Some(accepted) => accepted,
            // The accept loop never ends while this listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
