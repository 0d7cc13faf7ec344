//! What a move reports while it runs: to an observer (the CLI's bars, the tests), as metrics, and
//! how fast its rows go.

pub(crate) mod observer;
pub(crate) mod progress;
pub(crate) mod telemetry;
