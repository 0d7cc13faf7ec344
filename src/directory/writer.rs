//! Who, inside this extension, is writing one of its own bookkeeping tables right now. The guard
//! triggers on `shard_directory_version` and `shard_directory_history` let these writes through
//! and hold every other write to the rules a person at psql must follow.

use std::cell::Cell;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Writer {
    /// A restored entry raises the version to at least its own.
    Restore,
    /// `purge_history` removes old history.
    Purge,
}

thread_local! {
    static WRITER: Cell<Option<Writer>> = const { Cell::new(None) };
}

pub fn writing(w: Writer) -> bool {
    WRITER.get() == Some(w)
}

/// Runs `f` as `w`; the previous writer is restored even when `f` errors out (pgrx unwinds
/// through Drop).
pub fn as_writer<R>(w: Writer, f: impl FnOnce() -> R) -> R {
    struct Scope(Option<Writer>);
    impl Drop for Scope {
        fn drop(&mut self) {
            WRITER.set(self.0);
        }
    }
    let _scope = Scope(WRITER.replace(Some(w)));
    f()
}
