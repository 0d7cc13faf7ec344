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
    /// What it wrote that answered no request (not JSON, an unknown or no id): said when an
    /// answer does not come.
    stray: Arc<Mutex<Vec<String>>>,
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
        let stray: Arc<Mutex<Vec<String>>> = Arc::default();
        let (answers, strays) = (pending.clone(), stray.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let answer = serde_json::from_str::<Value>(&line).ok();
                let id = answer
                    .as_ref()
                    .and_then(|a| a.get("id"))
                    .and_then(Value::as_u64);
                let waiting = id.and_then(|id| answers.lock().unwrap().remove(&id));
                match (waiting, answer) {
                    (Some(tx), Some(answer)) => drop(tx.send(answer)),
                    _ => strays.lock().unwrap().push(line),
                }
            }
            // Its stdout ended: no request still waiting will be answered.
            answers.lock().unwrap().clear();
        });
        Ok(Driver {
            child,
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next: Mutex::new(0),
            stray,
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
        self.answer(op, rx).await
    }

    /// The answer `rx` brings, within `ANSWER_BOUND` (90 s), without its `id`: exactly one of
    /// `ok` and `error`.
    pub async fn answer(&self, op: &str, rx: oneshot::Receiver<Value>) -> Result<Value, Broken> {
        let strays = || {
            let stray = self.stray.lock().unwrap();
            match stray.is_empty() {
                true => String::new(),
                false => format!("; it wrote, answering no request: {}", stray.join(" | ")),
            }
        };
        let mut answer = match tokio::time::timeout(ANSWER_BOUND, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Err(Broken(format!("exited before answering {op}{}", strays()))),
            Err(_) => {
                return Err(Broken(format!(
                    "did not answer {op} within {ANSWER_BOUND:?}{}",
                    strays()
                )))
            }
        };
        if let Some(a) = answer.as_object_mut() {
            a.remove("id");
            if a.contains_key("ok") == a.contains_key("error") {
                return Err(Broken(format!(
                    "answered {op} with {answer}: neither or both of `ok` and `error`"
                )));
            }
        }
        Ok(answer)
    }

    /// Closes the client and waits for the driver to exit.
    pub async fn close(mut self) -> Result<(), Broken> {
        let closed = self.ask("close", json!({})).await?;
        if closed.get("ok").is_none() {
            return Err(Broken(format!("answered close with {closed}")));
        }
        drop(self.stdin);
        match tokio::time::timeout(ANSWER_BOUND, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(Broken(format!("exited with {status}"))),
            Ok(Err(e)) => Err(Broken(e.to_string())),
            Err(_) => Err(Broken(format!("did not exit within {ANSWER_BOUND:?}"))),
        }
    }
}
