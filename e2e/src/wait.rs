use std::future::Future;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

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

/// The backend behind `c`.
pub async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Any heavyweight lock, for [`blocked_on`].
pub const ANY_LOCK: &str = "true";

/// Waits (up to 10 s) until backend `pid` waits for a heavyweight lock matching `lock` (a
/// condition on `pg_locks`), or panics naming `what`.
pub async fn blocked_on(observer: &Client, pid: i32, lock: &str, what: &str) {
    let query =
        format!("SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted AND {lock})");
    eventually(what, Duration::from_secs(10), || async {
        let waiting: bool = observer.query_one(&query, &[&pid]).await.unwrap().get(0);
        waiting.then_some(())
    })
    .await;
}
