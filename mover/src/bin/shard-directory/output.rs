//! The one way a command prints its result: lines for a person, or with `--json` one JSON value
//! on stdout for a script; and how a command ends, as the exit codes of the CLI's doc say.

use serde::Serialize;
use shard_directory_mover::{Error, Failure, Left};

/// How a command prints: `--json` or lines.
#[derive(Clone, Copy)]
pub struct Print {
    json: bool,
}

impl Print {
    pub fn new(json: bool) -> Print {
        Print { json }
    }

    /// `items` as a JSON array with `--json`, else a line for each.
    pub fn each<T: Serialize>(&self, items: &[T], line: impl Fn(&T) -> String) {
        self.result(items, |items| lines(items.iter().map(line)));
    }

    /// `value` as JSON with `--json`, else the lines `lines` makes of it (nothing when none).
    pub fn result<T: Serialize + ?Sized>(&self, value: &T, lines: impl FnOnce(&T) -> String) {
        if self.json {
            println!("{}", pretty(value));
            return;
        }
        let lines = lines(value);
        if !lines.is_empty() {
            println!("{lines}");
        }
    }
}

/// One line each, for [`Print::result`].
pub fn lines(each: impl Iterator<Item = String>) -> String {
    each.collect::<Vec<_>>().join("\n")
}

/// `value` as indented JSON (plans are written to files with it too).
pub fn pretty<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("plain data serialises")
}

/// How the command ended, and the exit code that says so.
pub enum Outcome {
    Done,
    /// Exit code and message.
    Failed(u8, String),
    Usage(String),
}

/// The exit code of a move that failed: 4 busy, else as it was left.
pub fn exit_code(f: &Failure) -> u8 {
    match (&f.error, f.left) {
        (Error::Busy { .. }, _) => 4,
        (_, Left::Untouched | Left::Aborted) => 1,
        (_, Left::Resumable | Left::Released) => 3,
    }
}

/// How a failed move was left, as `--json` says it.
pub fn left_name(left: Left) -> &'static str {
    match left {
        Left::Untouched => "untouched",
        Left::Aborted => "aborted",
        Left::Released => "released",
        Left::Resumable => "resumable",
    }
}

/// The exit code of an error that ended a command.
pub fn error_code(e: &Error) -> u8 {
    match e {
        Error::Config(_) => 2,
        Error::Busy { .. } | Error::BatchBusy { .. } => 4,
        // A batch's runner stopped, its moves left where they were, resumable.
        Error::BatchStopped { .. } => 3,
        _ => 1,
    }
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Outcome {
        match error_code(&e) {
            2 => Outcome::Usage(e.to_string()),
            code => Outcome::Failed(code, e.to_string()),
        }
    }
}

impl From<Failure> for Outcome {
    fn from(f: Failure) -> Outcome {
        Outcome::Failed(exit_code(&f), f.to_string())
    }
}
