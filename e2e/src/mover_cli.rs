//! The `shard-directory` CLI run as an operator would, and killed (SIGKILL) mid-move as a crash
//! would: shared by the proof and the outage drills.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shard_directory_mover::Phase;

use crate::Topology;

/// The CLI, built beside the test binaries (`scripts/test.sh` builds it first:
/// `cargo build -p shard-directory-mover --bin shard-directory --features failpoints`), or the
/// one `SD_CLI` names (a long sweep runs a copy, so that a build meanwhile does not swap it).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SD_CLI") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test>, or target/<profile>/<program>: target/<profile>/shard-directory
    let bin = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("shard-directory"))
        .find(|bin| bin.exists())
        .unwrap_or_else(|| exe.with_file_name("shard-directory"));
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p shard-directory-mover --bin shard-directory --features \
         failpoints",
        bin.display()
    );
    bin
}

/// `shard-directory relay` on `t`'s directory as `role`, publishing to the Redis at `url`
/// with a heartbeat every 200 ms, sealed with `key` (killed on drop).
pub fn relay(t: &Topology, url: &str, key: &[u8], role: &str) -> tokio::process::Child {
    // In the directory's folder: removed with it.
    let key_file = t
        .directory
        .scratch_path(&format!("relay-key-{}", fastrand::u64(..)));
    std::fs::write(&key_file, [key, b"\n"].concat()).expect("write the relay's key");
    command(t)
        .env(
            "SHARD_DIRECTORY_URL",
            format!("{} user={role}", t.directory.conn_str("directory")),
        )
        .args(["relay", "--redis", url, "--heartbeat", "200ms"])
        .arg("--key-file")
        .arg(&key_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the relay")
}

/// The CLI on `t`'s directory (`SHARD_DIRECTORY_URL`), its output piped.
pub fn command(t: &Topology) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(binary());
    c.env("SHARD_DIRECTORY_URL", t.directory.conn_str("directory"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// A process's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The CLI's stdout, once it is known to have exited 0 (its whole output in the panic if not).
pub fn succeeded(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The phase of the tenant's open move, if any (a reversible move is not one: it waits for
/// `revert` or `finalize`).
pub async fn open_phase(t: &Topology, tenant: &str) -> Option<(i64, Phase)> {
    t.dba()
        .await
        .query_opt(
            "SELECT move_id, phase FROM shard_directory.shard_moves \
             WHERE entity_id = $1 AND finished_at IS NULL AND phase <> 'reversible'",
            &[&tenant],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), Phase::parse(r.get(1)).unwrap()))
}

/// A move whose process was killed.
#[derive(Debug)]
pub struct Killed {
    pub move_id: i64,
    /// The phase seen just before the kill.
    pub seen_at: Phase,
    /// Where the move really stopped (it may have gone on between the read and the kill); None
    /// when it finished all the same.
    pub stopped_at: Option<Phase>,
}

/// Moves `tenant` to `to` with `shard-directory move` and SIGKILLs the process `delay` after its
/// move reaches `kill_at` (or a later phase): inside the phase, not only at its start. None when
/// the move finished before.
pub async fn kill_at(
    t: &Topology,
    tenant: &str,
    to: &str,
    method: &str,
    kill_at: Phase,
    delay: Duration,
) -> Option<Killed> {
    let args = ["move", "tenant", tenant, "--to", to, "--method", method];
    kill_inside(t, tenant, &args, kill_at, delay).await
}

/// Runs `shard-directory <args>` (a move of `tenant`, or a revert) and SIGKILLs it `delay` after
/// the tenant's open move reaches `kill_at` (or a later phase). None when it finished before.
pub async fn kill_inside(
    t: &Topology,
    tenant: &str,
    args: &[&str],
    kill_at: Phase,
    delay: Duration,
) -> Option<Killed> {
    let mut child = command(t)
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .expect("run shard-directory");
    let started = Instant::now();
    let (move_id, seen_at) = loop {
        if let Some((id, phase)) = open_phase(t, tenant).await {
            if phase >= kill_at {
                tokio::time::sleep(delay).await;
                child.kill().await.expect("SIGKILL the mover");
                break (id, phase);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "the CLI move failed: {:?}",
                child.wait_with_output().await
            );
            return None;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "shard-directory {args:?} did not reach {kill_at}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    Some(Killed {
        move_id,
        seen_at,
        stopped_at: open_phase(t, tenant).await.map(|(_, p)| p),
    })
}

/// `shard-directory <verb> <move_id>` (`resume`, `abort`, `revert`, `finalize`), which must
/// succeed.
pub async fn finish(t: &Topology, verb: &str, move_id: i64) {
    let out = command(t)
        .args([verb, &move_id.to_string()])
        .output()
        .await
        .expect("run shard-directory resume/abort");
    assert!(
        out.status.success(),
        "shard-directory {verb} {move_id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A failpoint of the CLI that holds the process there (`wait:<path>`, mover/src/failpoint.rs)
/// until released: what a test does meanwhile happens exactly at that step.
pub struct Held(PathBuf);

impl Held {
    pub fn new(name: &str) -> Held {
        let held =
            Held(std::env::temp_dir().join(format!("sd-held-{name}-{}", std::process::id())));
        held.remove();
        held
    }

    /// `<path>.reached`, written by the CLI once held; `<path>.go`, which releases it.
    fn file(&self, suffix: &str) -> PathBuf {
        PathBuf::from(format!("{}.{suffix}", self.0.display()))
    }

    /// The failpoint's action: `wait:<path>`.
    pub fn action(&self) -> String {
        format!("wait:{}", self.0.display())
    }

    /// `FAILPOINTS` for the CLI: held the first time it reaches `point`.
    pub fn at(&self, point: &str) -> String {
        format!("{point}=1*return({})", self.action())
    }

    pub fn is_reached(&self) -> bool {
        self.file("reached").exists()
    }

    /// Waits (up to a minute) until the CLI is held there.
    pub async fn reached(&self) {
        crate::eventually(
            "the failpoint to be reached",
            Duration::from_secs(60),
            || async { self.is_reached().then_some(()) },
        )
        .await
    }

    pub fn release(&self) {
        std::fs::write(self.file("go"), "").expect("write <path>.go");
    }

    fn remove(&self) {
        for suffix in ["reached", "go"] {
            let _ = std::fs::remove_file(self.file(suffix));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.remove();
    }
}
