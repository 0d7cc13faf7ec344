//! Named points before every step of a move that changes state anywhere (the directory, a shard,
//! the move's record), for the failpoint sweep (`e2e/tests/suite/sweep.rs`) to fault each one.
//! Compiled in with the cargo feature `failpoints` only; without it [`point!`] expands to
//! nothing.
//!
//! The sweep needs no list kept by hand: run with `SD_FAILPOINT_CENSUS=<file>`, every point a
//! run reaches appends its name there, so a step given a point is swept from then on. A point is
//! faulted through TiKV's `fail` crate (`FAILPOINTS="<point>=1*return(<action>)"`, read when the
//! CLI starts), with these actions:
//!
//! - `kill`: the process is SIGKILLed there, as a crash would end it;
//! - `error`: the step fails, as a database error would make it;
//! - `stall:<ms>`: the step waits that long first (past a lease, say);
//! - `wait:<path>`: the process writes `<path>.reached` and waits for `<path>.go`, so that the
//!   sweep can restart a server or end the mover's sessions exactly there.

/// `point!("fence.{}.source", step)`: a failpoint named by the format, in a function returning
/// `Result<_, Error>`; nothing at all without the feature.
macro_rules! point {
    ($($name:tt)+) => {
        #[cfg(feature = "failpoints")]
        crate::failpoint::hit(&format!($($name)+)).await?;
    };
}
pub(crate) use point;

#[cfg(feature = "failpoints")]
pub(crate) async fn hit(point: &str) -> Result<(), crate::Error> {
    use std::io::Write;
    use std::time::Duration;

    if let Some(path) = std::env::var_os("SD_FAILPOINT_CENSUS") {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| writeln!(f, "{point}"));
        appended.expect("SD_FAILPOINT_CENSUS names a writable file");
    }
    let Some(action) = fail::eval(point, |arg| arg.unwrap_or_default()) else {
        return Ok(());
    };
    let (verb, arg) = action.split_once(':').unwrap_or((action.as_str(), ""));
    match verb {
        "kill" => {
            // SIGKILL, not an exit: nothing of this process runs after it, as in a crash.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            std::future::pending().await
        }
        "error" => Err(crate::Error::Injected {
            point: point.to_owned(),
        }),
        "stall" => {
            let ms = arg.parse().expect("stall:<milliseconds>");
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        }
        "wait" => {
            std::fs::write(format!("{arg}.reached"), point).expect("write <path>.reached");
            let go = std::path::PathBuf::from(format!("{arg}.go"));
            while !go.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(())
        }
        other => panic!("failpoint {point}: unknown action {other:?}"),
    }
}
