//! Waiting on the client: its futures run on the directory's runtime with the GIL released, and
//! a signal (Ctrl-C's KeyboardInterrupt, an alarm) raised meanwhile ends the wait as it would a
//! Python `sleep`: the future is dropped (a query in flight is cancelled with its connection).

use std::future::Future;
use std::time::Duration;

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
    py.detach(|| {
        runtime.block_on(async {
            tokio::pin!(future);
            loop {
                tokio::select! {
                    done = &mut future => return Ok(done),
                    _ = tokio::time::sleep(SIGNALS_EVERY) => {
                        Python::attach(|py| py.check_signals())?;
                    }
                }
            }
        })
    })
}
