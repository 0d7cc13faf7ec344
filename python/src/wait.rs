//! Waiting on the client: its futures run on the directory's runtime with the GIL released, and
//! a signal (Ctrl-C's KeyboardInterrupt, an alarm) raised meanwhile ends the wait as it would a
//! Python `sleep`: the future is dropped (a query in flight is cancelled with its connection).
//! A future that is ready at once (a cached route, a cached entry) is answered on the caller's
//! thread with the GIL held: no thread handoff, no timer.

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// How often a wait looks for a signal.
const SIGNALS_EVERY: Duration = Duration::from_millis(50);

/// `future` run to its end on `runtime`, or the error of a signal's handler.
pub fn wait<T: Send>(
    py: Python<'_>,
    runtime: &Runtime,
    future: impl Future<Output = T> + Send,
) -> PyResult<T> {
    let mut future = std::pin::pin!(future);
    {
        // In the runtime's context: a first poll may start a timer or a query.
        let _context = runtime.enter();
        if let Some(done) = future.as_mut().now_or_never() {
            return Ok(done);
        }
    }
    py.detach(|| {
        runtime.block_on(async {
            loop {
                tokio::select! {
                    done = future.as_mut() => return Ok(done),
                    _ = tokio::time::sleep(SIGNALS_EVERY) => {
                        Python::attach(|py| py.check_signals())?;
                    }
                }
            }
        })
    })
}
