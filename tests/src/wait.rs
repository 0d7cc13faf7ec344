use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` until it returns `Some`, or panics naming `what` after `deadline`: tests wait on
/// a condition, never on a sleep.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(deadline, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {deadline:?} waiting for {what}"))
}

/// Polls `check` until it returns `Some`; `None` once `deadline` has passed without.
pub async fn within<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (with a deadline) until something accepts TCP connections on `port` of the loopback.
pub async fn accepting(what: &str, port: u16) {
    eventually(
        &format!("{what} to accept connections"),
        Duration::from_secs(10),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}
