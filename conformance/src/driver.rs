//! A client under test, behind its driver: a process that reads requests as JSON lines on stdin
//! and writes one answer line per request on stdout, `{"id", "ok": ...}` or `{"id", "error":
//! {"kind", ...}}`, in any order (a request may wait while others are answered). The protocol is
//! conformance/README.md's.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// Longest wait for one answer: past it the driver is taken as hung.
const ANSWER_BOUND: Duration = Duration::from_secs(90);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A running driver.
pub struct Driver {
    child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    pending: Pending,
    next: Mutex<u64>,
}

/// An answer that never came: the driver exited, hung or wrote something else.
#[derive(Debug, thiserror::Error)]
#[error("driver: {0}")]
pub struct Broken(pub String);

impl Driver {
    /// Starts `command` (run by `sh -c`).
    pub fn start(command: &str) -> Result<Driver, Broken> {
        let mut child = Command::new("sh")
            .args(["-c", command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Broken(format!("{command}: {e}")))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let pending: Pending = Arc::default();
        let answers = pending.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(answer) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("driver wrote a line that is not JSON: {line}");
                    continue;
                };
                let id = answer.get("id").and_then(Value::as_u64);
                let waiting = id.and_then(|id| answers.lock().unwrap().remove(&id));
                match waiting {
                    Some(tx) => drop(tx.send(answer)),
                    None => eprintln!("driver answered no request: {line}"),
                }
            }
        });
        Ok(Driver {
            child,
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next: Mutex::new(0),
        })
    }

    /// Sends `op` with its fields and returns the receiver of its answer.
    pub async fn send(&self, op: &str, fields: Value) -> Result<oneshot::Receiver<Value>, Broken> {
        let id = {
            let mut next = self.next.lock().unwrap();
            *next += 1;
            *next
        };
        let mut request = json!({"id": id, "op": op});
        if let (Some(r), Value::Object(f)) = (request.as_object_mut(), fields) {
            r.extend(f);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut line = request.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Broken(format!("writing {op}: {e}")))?;
        stdin
            .flush()
            .await
            .map_err(|e| Broken(format!("writing {op}: {e}")))?;
        Ok(rx)
    }

    /// Sends `op` and waits for its answer (without its `id`).
    pub async fn ask(&self, op: &str, fields: Value) -> Result<Value, Broken> {
        let rx = self.send(op, fields).await?;
        answer(op, rx).await
    }

    /// Closes the client and waits for the driver to exit.
    pub async fn close(mut self) -> Result<(), Broken> {
        self.ask("close", json!({})).await?;
        drop(self.stdin);
        match tokio::time::timeout(ANSWER_BOUND, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(Broken(format!("exited with {status}"))),
            Ok(Err(e)) => Err(Broken(e.to_string())),
            Err(_) => Err(Broken(format!("did not exit within {ANSWER_BOUND:?}"))),
        }
    }
}

/// The answer `rx` brings, within `ANSWER_BOUND` (90 s), without its `id`.
pub async fn answer(op: &str, rx: oneshot::Receiver<Value>) -> Result<Value, Broken> {
    match tokio::time::timeout(ANSWER_BOUND, rx).await {
        Ok(Ok(mut answer)) => {
            if let Some(a) = answer.as_object_mut() {
                a.remove("id");
            }
            Ok(answer)
        }
        Ok(Err(_)) => Err(Broken(format!("exited before answering {op}"))),
        Err(_) => Err(Broken(format!(
            "did not answer {op} within {ANSWER_BOUND:?}"
        ))),
    }
}
