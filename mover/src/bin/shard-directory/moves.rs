//! One move: `move`, `resume`, `revert`, `finalize`, `abort`, `purge-source`, each run to its end
//! (SIGINT or SIGTERM aborts it before its cutover, finishes it after) and reported.

use std::future::Future;

use serde_json::json;
use shard_directory_mover::{Error, Failure, Left, MoveRecord, Mover, Phase};
use shard_directory_protocol::EntityKey;

use crate::output::{left_name, Outcome, Print};
use crate::progress::Progress;

/// `move`: checks and prints the plan (`--dry-run`), or moves `key` to `to`.
pub async fn start(
    mover: &Mover,
    progress: &Progress,
    print: Print,
    key: &EntityKey,
    to: &str,
    dry_run: bool,
) -> Result<(), Outcome> {
    if dry_run {
        print.result(&mover.plan(key, to).await?, |plan| plan.to_string());
        return Ok(());
    }
    let work = mover.start(key, to);
    report(
        run_to_the_end(mover, progress, Some(key), work).await,
        print,
    )
}

/// `resume`: a move from where it stopped.
pub async fn resume(
    mover: &Mover,
    progress: &Progress,
    print: Print,
    move_id: i64,
) -> Result<(), Outcome> {
    let work = mover.resume(move_id);
    report(run_to_the_end(mover, progress, None, work).await, print)
}

/// `revert`: a reversible move's entity back where it came from.
pub async fn revert(
    mover: &Mover,
    progress: &Progress,
    print: Print,
    move_id: i64,
) -> Result<(), Outcome> {
    let key = mover.status(move_id).await?.entity();
    let work = mover.revert(move_id);
    report(
        run_to_the_end(mover, progress, Some(&key), work).await,
        print,
    )
}

/// `finalize`: one reversible move, or (`--expired`, no id) each whose time has run out, in
/// turn; the last failure (each printed) is the exit code.
pub async fn finalize(
    mover: &Mover,
    progress: &Progress,
    print: Print,
    move_id: Option<i64>,
) -> Result<(), Outcome> {
    if let Some(move_id) = move_id {
        let work = mover.finalize(move_id);
        return report(run_to_the_end(mover, progress, None, work).await, print);
    }
    let mut last = Ok(());
    for result in mover.finalize_expired().await? {
        if let Err(Outcome::Failed(code, message)) = report(result, print) {
            eprintln!("shard-directory: {message}");
            last = Err(Outcome::Failed(
                code,
                "a move could not be finalized".into(),
            ));
        }
    }
    last
}

/// `abort`: a move back to its start.
pub async fn abort(mover: &Mover, print: Print, move_id: i64) -> Result<(), Outcome> {
    report(mover.abort(move_id).await, print)
}

/// `purge-source`: the rows a `move --keep-source` left on its source.
pub async fn purge_source(mover: &Mover, print: Print, move_id: i64) -> Result<(), Outcome> {
    let record = mover.purge_source(move_id).await?;
    print.result(&record, |r| summary(r, None));
    Ok(())
}

/// A move's outcome, printed as `--json` asks: the record, or what failed and how it was left.
fn report(result: Result<MoveRecord, Failure>, print: Print) -> Result<(), Outcome> {
    match result {
        Ok(record) => {
            print.result(&record, |r| summary(r, None));
            Ok(())
        }
        // For a person the error goes to stderr, with the exit code.
        Err(failure) => {
            let failed = json!({
                "error": failure.error.to_string(),
                "left": left_name(failure.left),
                "move_id": failure.move_id,
                "phase": failure.phase.map(|p| p.as_str()),
                "abort_error": failure.abort_error.as_ref().map(|e| e.to_string()),
            });
            print.result(&failed, |_| String::new());
            Err(failure.into())
        }
    }
}

/// Resolves when the process is asked to stop (SIGINT, SIGTERM).
pub(crate) async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(int), Ok(term)) => (int, term),
        _ => return std::future::pending().await,
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Runs a move to its end, unless the process is asked to stop: then the run is dropped (its
/// sessions end, and its lock with them) and the move is aborted if it has not passed its
/// cutover, or finished if it has.
async fn run_to_the_end(
    mover: &Mover,
    progress: &Progress,
    key: Option<&EntityKey>,
    work: impl Future<Output = Result<MoveRecord, Failure>>,
) -> Result<MoveRecord, Failure> {
    let untouched = |e| Failure {
        move_id: None,
        error: e,
        left: Left::Untouched,
        phase: None,
        abort_error: None,
    };
    tokio::select! {
        result = work => return result,
        () = interrupted() => {}
    }
    progress.line("interrupted: stopping the move");
    let id = match progress.move_id() {
        Some(id) => Some(id),
        // Interrupted before the first phase was reported: the move may have begun all the same.
        None => match key {
            Some(key) => mover
                .list(true, None)
                .await
                .map_err(untouched)?
                .into_iter()
                .find(|r| r.entity() == *key && r.phase != Phase::Reversible)
                .map(|r| r.move_id),
            None => None,
        },
    };
    let Some(id) = id else {
        return Err(untouched(Error::Config(
            "interrupted before the move began: nothing was changed".into(),
        )));
    };
    let phase = mover.status(id).await.map_err(untouched)?.phase;
    if phase.can_abort() {
        progress.line(&format!("move {id}: aborting it (it had not cut over)"));
        let aborted = mover.abort(id).await?;
        Err(Failure {
            move_id: Some(id),
            error: Error::State {
                move_id: id,
                phase: aborted.phase,
                why: "interrupted before its cutover".into(),
            },
            left: Left::Aborted,
            phase: Some(aborted.phase),
            abort_error: None,
        })
    } else {
        progress.line(&format!(
            "move {id}: finishing it (it has cut over: only forward)"
        ));
        mover.resume(id).await
    }
}

/// A move in lines; `streaming`, when known (`status` of one move reads its slot), whether a
/// reversible move's way back streams.
pub fn summary(r: &MoveRecord, streaming: Option<bool>) -> String {
    let freeze = r.freeze_time().map_or("-".to_owned(), |d| {
        humantime::format_duration(d).to_string()
    });
    let mut s = format!(
        "move {} {}: {}/{} {} -> {} by {}, cutover version {}, freeze {freeze}",
        r.move_id,
        r.phase,
        r.entity_type,
        r.entity_id,
        r.source_shard,
        r.target_shard,
        r.method.as_str(),
        r.cutover_version.map_or("-".to_owned(), |v| v.to_string()),
    );
    for (table, p) in &r.tables {
        s.push_str(&format!(
            "\n  {table}: {} rows, copied {}, verified {}, deleted on source {}",
            p.rows,
            p.copied,
            p.verified.map_or("-".to_owned(), |v| v.to_string()),
            p.deleted
        ));
        if let (Some(rate), Some(eta), false) =
            (p.rows_per_second, p.eta_seconds, r.phase.is_finished())
        {
            s.push_str(&format!(" ({rate} rows/s, {eta} s left)"));
        }
    }
    if r.phase == Phase::Reversible {
        let until = r
            .reversible_until
            .as_deref()
            .map_or(String::new(), |u| format!(" until {u}"));
        let way_back = match streaming {
            Some(true) => format!("its rows stream back to {}", r.source_shard),
            Some(false) => format!(
                "its way back to {} is not streaming: {}'s rows fall behind until it streams \
                 again, and {} keeps the WAL it needs",
                r.source_shard, r.source_shard, r.target_shard
            ),
            None => format!("a way back keeps {}'s rows", r.source_shard),
        };
        s.push_str(&format!(
            "\n  reversible{until}: {way_back}; `revert {}` takes it back, `finalize {}` ends that",
            r.move_id, r.move_id
        ));
    }
    if let Some(reversible) = r.reverses {
        s.push_str(&format!("\n  reverts move {reversible}"));
    }
    if let Some(e) = &r.last_error {
        s.push_str(&format!("\n  last error: {e}"));
    }
    s
}
