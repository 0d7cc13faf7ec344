//! The directory's bookkeeping rows (its version, its history), written straight to the heap as
//! PostgreSQL writes its catalogs, and as Citus writes its metadata tables: no statement, no
//! executor, no plan. These writes are on every directory change's path, and running them as SQL
//! through SPI cost more than the rest of the change (a `perf` profile of `bench_directory`).
//! `changes_since`, which every router calls on every change, reads them the same way.
//!
//! What SQL would have done is ours to do: every column gets a value (an identity from its
//! sequence, a column a DBA added its default), the values written are ones the tables' own
//! CHECK constraints accept and any a DBA added are checked, the indexes are kept, and the
//! version row is written under the lock that orders versions. No trigger fires and no
//! privilege is checked: these are the extension's own writes, made for a writer who holds no
//! privilege on these tables.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::prelude::*;

use super::columns;
use crate::catalog;
use crate::error::SdError;

unsafe extern "C-unwind" {
    /// `nextval()` without its privilege check (commands/sequence.h); pgrx has no binding.
    fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
}

thread_local! {
    /// The identity column last written, and its sequence.
    static IDENTITY: Cell<Option<((pg_sys::Oid, i16), pg_sys::Oid)>> = const { Cell::new(None) };
}

/// The value of one column of a row being written.
pub type Column<'a> = (&'a CStr, Option<pg_sys::Datum>);

/// The CHECK constraints the extension makes on the tables written here (named by PostgreSQL).
const OWN_CHECKS: [&CStr; 2] = [
    c"shard_directory_history_op_check",
    c"shard_directory_version_id_check",
];

/// A table of the extension opened for writing (`RowExclusiveLock`, kept until the transaction
/// ends, as the executor keeps it).
struct Table(pg_sys::Relation);

impl Table {
    fn open(relid: pg_sys::Oid) -> Table {
        // SAFETY: an OID of the extension's tables; an error is raised, not returned.
        Table(unsafe { pg_sys::table_open(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) })
    }

    /// Opened for reading only (`AccessShareLock`: a standby grants no other).
    fn open_to_read(relid: pg_sys::Oid) -> Table {
        // SAFETY: as for `open`.
        Table(unsafe { pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) })
    }

    fn relid(&self) -> pg_sys::Oid {
        // SAFETY: the relation is open while `self` lives.
        unsafe { (*self.0).rd_id }
    }

    fn attributes(&self) -> &[pg_sys::FormData_pg_attribute] {
        // SAFETY: the descriptor lives as long as the relation is open.
        unsafe { crate::catalog::attributes((*self.0).rd_att) }
    }

    /// The position (from 1) of column `name`; an error naming it when the table has none, or
    /// when it is not of the type it is read and written as.
    fn has(&self, name: &CStr) -> bool {
        // SAFETY: the open relation's descriptor and a NUL-terminated name.
        unsafe { pg_sys::SPI_fnumber((*self.0).rd_att, name.as_ptr()) > 0 }
    }

    fn attnum(&self, name: &CStr) -> i32 {
        // SAFETY: the open relation's descriptor and a NUL-terminated name.
        let attnum = unsafe { pg_sys::SPI_fnumber((*self.0).rd_att, name.as_ptr()) };
        if attnum <= 0 {
            self.broken(format!("no column {name:?}"));
        }
        columns::check(
            // SAFETY: the open relation's descriptor.
            unsafe { (*self.0).rd_att },
            &self.attributes()[attnum as usize - 1],
        );
        attnum
    }

    fn broken(&self, problem: String) -> ! {
        SdError::Spi {
            during: "write the directory's bookkeeping",
            cause: format!("{}: {problem}", catalog::relation_name(self.relid())),
            datatype: false,
        }
        .raise()
    }

    /// The row's values and nulls in the table's column order. A column not in `columns` (one a
    /// DBA added) gets its identity's next value, else its default, else NULL where NULL is
    /// allowed; a generated one is refused.
    fn form(
        &self,
        columns: &[Column<'_>],
        executor: &mut Option<Executor>,
    ) -> (Vec<pg_sys::Datum>, Vec<bool>) {
        let mut values = Vec::with_capacity(self.attributes().len());
        let mut nulls = Vec::with_capacity(self.attributes().len());
        for (i, attr) in self.attributes().iter().enumerate() {
            // SAFETY: an attribute's name is NUL-terminated within its fixed-size field.
            let name = unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) };
            let given = columns.iter().find(|(c, _)| *c == name).map(|(_, v)| *v);
            let value = match given {
                _ if attr.attisdropped => None,
                Some(value) => {
                    // SAFETY: the open relation's descriptor.
                    columns::check(unsafe { (*self.0).rd_att }, attr);
                    value
                }
                None if attr.attidentity != 0 => Some(self.next_identity(i)),
                None if attr.attgenerated != 0 => self.broken(format!(
                    "its generated column {name:?} cannot be computed by the extension's writes; drop it"
                )),
                None if attr.atthasdef => executor
                    .get_or_insert_with(|| Executor::new(self, false))
                    .default_of(self, i + 1),
                None => None,
            };
            if value.is_none() && attr.attnotnull && !attr.attisdropped {
                self.broken(format!("no value for its NOT NULL column {name:?}"));
            }
            values.push(value.unwrap_or(pg_sys::Datum::from(0)));
            nulls.push(value.is_none());
        }
        (values, nulls)
    }

    /// Whether the table has a CHECK constraint the extension did not make: the values these
    /// writes make pass the extension's own, and those a DBA added are checked.
    fn has_added_checks(&self) -> bool {
        // SAFETY: the descriptor and its constraints live as long as the relation is open.
        unsafe {
            let constr = (*(*self.0).rd_att).constr;
            if constr.is_null() || (*constr).num_check == 0 {
                return false;
            }
            catalog::slice((*constr).check, (*constr).num_check)
                .iter()
                .any(|c| !OWN_CHECKS.contains(&CStr::from_ptr(c.ccname)))
        }
    }

    /// Column `name` of `tuple`, a tuple of this table; `None` when NULL.
    ///
    /// # Safety
    /// `tuple` is a valid tuple of this table.
    unsafe fn get(&self, tuple: pg_sys::HeapTuple, name: &CStr) -> Option<pg_sys::Datum> {
        let mut is_null = false;
        // SAFETY: the caller's tuple is this table's; the position is one of its columns.
        let datum = unsafe {
            pg_sys::heap_getattr(tuple, self.attnum(name), (*self.0).rd_att, &mut is_null)
        };
        (!is_null).then_some(datum)
    }

    /// A copy of `tuple` with `columns` replaced.
    ///
    /// # Safety
    /// `tuple` is a valid tuple of this table.
    unsafe fn modify(&self, tuple: pg_sys::HeapTuple, columns: &[Column<'_>]) -> pg_sys::HeapTuple {
        let at: Vec<_> = columns
            .iter()
            .map(|(name, value)| (self.attnum(name) as usize, *value))
            .collect();
        // SAFETY: the caller's tuple is this table's; the positions are its columns'.
        unsafe { modified(tuple, (*self.0).rd_att, &at) }
    }

    fn next_identity(&self, index: usize) -> pg_sys::Datum {
        let column = (self.relid(), (index + 1) as i16);
        let sequence = match IDENTITY.get() {
            Some((known, sequence)) if known == column => sequence,
            _ => {
                // Found through pg_depend: a scan worth doing once per backend, not per row. A
                // table made anew (the extension re-created) has a new OID, so a new lookup.
                // SAFETY: plain values; a column without a sequence raises an error.
                #[cfg(any(feature = "pg15", feature = "pg16"))]
                let sequence = unsafe { pg_sys::getIdentitySequence(column.0, column.1, false) };
                // 17 looks it up from the open relation.
                #[cfg(any(feature = "pg17", feature = "pg18"))]
                // SAFETY: the open relation; a column without a sequence raises an error.
                let sequence = unsafe { pg_sys::getIdentitySequence(self.0, column.1, false) };
                IDENTITY.set(Some((column, sequence)));
                sequence
            }
        };
        // SAFETY: a sequence's OID; an ERROR is turned into a Rust panic by the guard.
        let value =
            unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| nextval_internal(sequence, false)) };
        pg_sys::Datum::from(value)
    }
}

/// A copy of `tuple` with the columns at `columns`' positions (from 1) replaced, formed once.
///
/// # Safety
/// `tuple` is a valid tuple described by `desc`, and the positions are within it.
pub unsafe fn modified(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    columns: &[(usize, Option<pg_sys::Datum>)],
) -> pg_sys::HeapTuple {
    // SAFETY: the caller's descriptor is valid.
    let natts = unsafe { (*desc).natts } as usize;
    let (mut values, mut nulls, mut replace) = (
        vec![pg_sys::Datum::from(0); natts],
        vec![false; natts],
        vec![false; natts],
    );
    for &(attnum, value) in columns {
        let i = attnum - 1;
        values[i] = value.unwrap_or(pg_sys::Datum::from(0));
        nulls[i] = value.is_none();
        replace[i] = true;
    }
    // SAFETY: the caller's tuple is described by `desc`; the arrays have one element per
    // attribute.
    unsafe {
        pg_sys::heap_modify_tuple(
            tuple,
            desc,
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
            replace.as_mut_ptr(),
        )
    }
}

/// A table's indexes opened for maintenance by the writes here (as PostgreSQL maintains its
/// catalogs' indexes); closed on drop.
struct Indexes(pg_sys::CatalogIndexState);

impl Indexes {
    /// Refuses an index of a kind these writes cannot keep right: an expression or a partial
    /// index (one a DBA added by hand) would need the executor.
    fn open(table: &Table) -> Indexes {
        // SAFETY: the index infos live in the state, which lives until `CatalogCloseIndexes`.
        unsafe {
            let state = Indexes(pg_sys::CatalogOpenIndexes(table.0));
            // A table without indexes has no list of them (NULL), not an empty one.
            let infos = catalog::slice((*state.0).ri_IndexRelationInfo, (*state.0).ri_NumIndices);
            if infos
                .iter()
                .any(|&i| !(*i).ii_Expressions.is_null() || !(*i).ii_Predicate.is_null())
            {
                table.broken("an expression or partial index on it cannot be kept by the extension's writes; drop it".into());
            }
            state
        }
    }
}

impl Drop for Indexes {
    fn drop(&mut self) {
        // SAFETY: opened by `Indexes::open`, closed once.
        unsafe { pg_sys::CatalogCloseIndexes(self.0) }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: opened by `Table::open`, closed once; its lock is kept to the transaction's end.
        unsafe { pg_sys::table_close(self.0, pg_sys::NoLock as pg_sys::LOCKMODE) }
    }
}

/// Inserts one row into `relid`, indexes included.
pub fn insert(relid: pg_sys::Oid, columns: &[Column<'_>]) {
    let table = Table::open(relid);
    let mut executor = None;
    let (mut values, mut nulls) = table.form(columns, &mut executor);
    // SAFETY: the descriptor matches `values` and `nulls` (one per attribute); the tuple is
    // palloc'd in the current context and freed with it; the values of defaults live in the
    // executor's memory until it drops, after the tuple is formed.
    unsafe {
        let tuple =
            pg_sys::heap_form_tuple((*table.0).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
        if table.has_added_checks() {
            executor
                .get_or_insert_with(|| Executor::new(&table, false))
                .check(tuple);
        }
        pg_sys::CatalogTupleInsertWithInfo(table.0, tuple, Indexes::open(&table).0);
    }
}

/// The executor's state, made only for what these writes need of it: a DBA's column defaults
/// and CHECK constraints, and the index entries of rows stamped again. Freed on drop.
struct Executor {
    estate: *mut pg_sys::EState,
    info: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    indexes: bool,
}

impl Executor {
    /// For `table`; with its indexes open when `indexes`.
    fn new(table: &Table, indexes: bool) -> Executor {
        // SAFETY: the result relation info is zeroed, then filled in by PostgreSQL for the open
        // relation; everything lives until drop.
        unsafe {
            let estate = pg_sys::CreateExecutorState();
            let info: *mut pg_sys::ResultRelInfo =
                pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()).cast();
            (*info).type_ = pg_sys::NodeTag::T_ResultRelInfo;
            pg_sys::InitResultRelInfo(info, table.0, 0, std::ptr::null_mut(), 0);
            if indexes {
                pg_sys::ExecOpenIndices(info, false);
            }
            let slot = pg_sys::MakeSingleTupleTableSlot(
                (*table.0).rd_att,
                &raw const pg_sys::TTSOpsHeapTuple,
            );
            Executor {
                estate,
                info,
                slot,
                indexes,
            }
        }
    }

    /// The default of `table`'s column `attnum` (from 1) for a new row; `None` for NULL.
    fn default_of(&self, table: &Table, attnum: usize) -> Option<pg_sys::Datum> {
        // SAFETY: the expression is PostgreSQL's own for the column, prepared and evaluated in
        // this executor state, whose memory holds the value until drop.
        unsafe {
            let expr = pg_sys::build_column_default(table.0, attnum as i32);
            if expr.is_null() {
                return None;
            }
            let state = pg_sys::ExecPrepareExpr(expr.cast(), self.estate);
            let mut context = (*self.estate).es_per_tuple_exprcontext;
            if context.is_null() {
                context = pg_sys::MakePerTupleExprContext(self.estate);
            }
            let mut is_null = false;
            let value = pg_sys::ExecEvalExprSwitchContext(state, context, &mut is_null);
            (!is_null).then_some(value)
        }
    }

    /// Refuses `tuple` as a write of the executor would: its NOT NULL columns and every CHECK
    /// constraint (23502, 23514, naming the table and the constraint).
    ///
    /// # Safety
    /// `tuple` is a valid tuple of the executor's table.
    unsafe fn check(&self, tuple: pg_sys::HeapTuple) {
        // SAFETY: the caller's tuple is the table's; the slot and the state are this executor's.
        unsafe {
            pg_sys::ExecStoreHeapTuple(tuple, self.slot, false);
            pg_sys::ExecConstraints(self.info, self.slot, self.estate);
        }
    }

    /// Makes the index entries of `tuple`, a new version of a row (not a HOT one), as the
    /// executor does, partial and expression indexes included.
    ///
    /// # Safety
    /// `tuple` is a valid tuple of the executor's table, just written; the executor was made
    /// with its indexes.
    unsafe fn insert_index_entries(&self, tuple: pg_sys::HeapTuple) {
        // SAFETY: as for `check`; the indexes were opened with the executor.
        unsafe {
            pg_sys::ExecStoreHeapTuple(tuple, self.slot, false);
            let (info, slot, estate) = (self.info, self.slot, self.estate);
            let (conflict, arbiters) = (std::ptr::null_mut(), std::ptr::null_mut());
            #[cfg(feature = "pg15")]
            pg_sys::ExecInsertIndexTuples(info, slot, estate, false, false, conflict, arbiters);
            // 16 can limit the insert to summarizing indexes: all of them here.
            #[cfg(not(feature = "pg15"))]
            pg_sys::ExecInsertIndexTuples(
                info, slot, estate, false, false, conflict, arbiters, false,
            );
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // SAFETY: made by `Executor::new`, freed once, in the reverse order.
        unsafe {
            pg_sys::ExecDropSingleTupleTableSlot(self.slot);
            if self.indexes {
                pg_sys::ExecCloseIndices(self.info);
            }
            pg_sys::FreeExecutorState(self.estate);
        }
    }
}

/// Reads the singleton row of `relid` under `snapshot`: at `hint`, where the newest version of
/// it was written, when a tuple there is visible (the table holds one row, so a visible tuple is
/// it); otherwise through its primary key, whose entry points at the oldest version the page
/// keeps, from which the row's chain of versions is walked. The row's page moves when the table
/// bloats (a one-row table updated by every change does, whenever pruning falls behind), and a
/// scan of the heap would read every page of it.
///
/// # Safety
/// `snapshot` must be valid for the read; `f` gets the row's tuple, valid only during the call.
unsafe fn with_singleton<R>(
    table: &Table,
    table_name: &'static str,
    snapshot: pg_sys::Snapshot,
    hint: Option<pg_sys::ItemPointerData>,
    f: impl FnOnce(pg_sys::HeapTuple) -> R,
) -> R {
    // SAFETY: the relation is open; a buffer read is released before returning, and a scan
    // ended; the tuple handed to `f` lives while it runs.
    unsafe {
        if let Some(tid) = hint {
            let (block, _) = pgrx::itemptr::item_pointer_get_both(tid);
            // A block past the end (the table made anew, or truncated) cannot be read.
            let blocks =
                pg_sys::RelationGetNumberOfBlocksInFork(table.0, pg_sys::ForkNumber::MAIN_FORKNUM);
            if block < blocks {
                // The page pruned first, as an index scan does: reads are what keep the page
                // from filling up with the row's old versions (without it, the table grew by
                // 231 pages in 5 s of pgbench). Pruning keeps a visible tuple at its place.
                let page = pg_sys::ReadBuffer(table.0, block);
                pg_sys::heap_page_prune_opt(table.0, page);
                pg_sys::ReleaseBuffer(page);
                let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
                tuple.t_self = tid;
                let mut buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
                if pg_sys::heap_fetch(table.0, snapshot, &mut tuple, &mut buffer, false) {
                    let result = f(&mut tuple);
                    pg_sys::ReleaseBuffer(buffer);
                    return result;
                }
            }
        }
        let scan = pg_sys::systable_beginscan(
            table.0,
            crate::catalog::primary_key_index(table.0),
            true,
            snapshot,
            0,
            std::ptr::null_mut(),
        );
        let tuple = pg_sys::systable_getnext(scan);
        if tuple.is_null() {
            pg_sys::systable_endscan(scan);
            SdError::SingletonMissing { table: table_name }.raise();
        }
        let result = f(tuple);
        pg_sys::systable_endscan(scan);
        result
    }
}

/// Columns `names` of the singleton row of `relid` as the running query's snapshot shows it.
pub fn read_singleton<const N: usize>(
    relid: pg_sys::Oid,
    table_name: &'static str,
    hint: Option<pg_sys::ItemPointerData>,
    names: [&CStr; N],
) -> [Option<pg_sys::Datum>; N] {
    let table = Table::open_to_read(relid);
    // SAFETY: the active snapshot is the query's, valid while it runs; the columns read are of
    // types passed by value (the datums outlive the tuple).
    unsafe {
        with_singleton(
            &table,
            table_name,
            pg_sys::GetActiveSnapshot(),
            hint,
            |tuple| names.map(|name| table.get(tuple, name)),
        )
    }
}

/// Visits the rows of `relid` whose `column` (a `bigint`, the first column of `index`) is in
/// `(above, up_to]`, in its order, as the running query's snapshot shows them, until `visit`
/// returns false; with no bounds (`None`), every row. `visit` gets a row's columns by name.
pub fn scan_bigint_range(
    relid: pg_sys::Oid,
    index: pg_sys::Oid,
    column: &CStr,
    bounds: Option<(i64, i64)>,
    mut visit: impl FnMut(&dyn Fn(&CStr) -> Option<pg_sys::Datum>) -> bool,
) {
    let table = Table::open_to_read(relid);
    let attnum = table.attnum(column);
    // SAFETY: the scan keys, the snapshot (the query's) and each tuple live across their use.
    unsafe {
        let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
        let nkeys = match bounds {
            Some((above, up_to)) => {
                for (key, strategy, procedure, value) in [
                    (0, pg_sys::BTGreaterStrategyNumber, pg_sys::F_INT8GT, above),
                    (
                        1,
                        pg_sys::BTLessEqualStrategyNumber,
                        pg_sys::F_INT8LE,
                        up_to,
                    ),
                ] {
                    pg_sys::ScanKeyInit(
                        &mut keys[key],
                        attnum as pg_sys::AttrNumber,
                        strategy as pg_sys::StrategyNumber,
                        pg_sys::Oid::from(procedure),
                        pg_sys::Datum::from(value),
                    );
                }
                2
            }
            None => 0,
        };
        let scan = pg_sys::systable_beginscan(
            table.0,
            index,
            true,
            pg_sys::GetActiveSnapshot(),
            nkeys,
            keys.as_mut_ptr(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() || !visit(&|name: &CStr| table.get(tuple, name)) {
                break;
            }
        }
        pg_sys::systable_endscan(scan);
    }
}

/// Column `name` of the singleton row of `relid` as its newest version shows it, waiting for no
/// one, and whether another transaction is updating that row right now (its new value is not
/// committed yet).
pub fn peek_singleton(
    relid: pg_sys::Oid,
    table_name: &'static str,
    name: &CStr,
) -> (Option<pg_sys::Datum>, bool) {
    let table = Table::open(relid);
    // SAFETY: a dirty snapshot is PostgreSQL's `InitDirtySnapshot`: only its type is set; the
    // scan fills in the updater it saw.
    unsafe {
        let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
        dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
        let value = with_singleton(&table, table_name, &mut dirty, None, |tuple| {
            table.get(tuple, name)
        });
        (value, dirty.xmax != pg_sys::InvalidTransactionId)
    }
}

/// Text column `name` of the singleton row of `relid` (looked for at `hint` first) as the
/// running statement's snapshot sees it; `None` when it is null or the table has no such column.
/// Opened to read only, as a SELECT of the row is: it waits for no lock a reader would not.
pub fn read_singleton_text(
    relid: pg_sys::Oid,
    table_name: &'static str,
    name: &CStr,
    hint: Option<pg_sys::ItemPointerData>,
) -> Option<String> {
    let table = Table::open_to_read(relid);
    if !table.has(name) {
        return None;
    }
    // SAFETY: the value is copied out while the scan holds the tuple; the active snapshot (or,
    // outside a statement, the transaction's) lives through the scan.
    unsafe {
        let snapshot = if pg_sys::ActiveSnapshotSet() {
            pg_sys::GetActiveSnapshot()
        } else {
            pg_sys::GetTransactionSnapshot()
        };
        with_singleton(&table, table_name, snapshot, hint, |tuple| {
            table
                .get(tuple, name)
                .and_then(|d| String::from_datum(d, false))
        })
    }
}

/// Whether `relid` has a column `name` (one a newer extension added may not be there yet).
pub fn has_column(relid: pg_sys::Oid, name: &CStr) -> bool {
    Table::open(relid).has(name)
}

/// The singleton row of `relid` as the latest committed state plus this transaction's own
/// changes shows it (looked for at `hint` first), handed to `change`, which returns the columns
/// to replace; the row is rewritten with them. The caller holds the lock every writer of this
/// row takes, so no other transaction can be changing it: the row read is the one to update.
/// Returns `change`'s result and where the row was written.
pub fn update_singleton<R>(
    relid: pg_sys::Oid,
    table_name: &'static str,
    hint: Option<pg_sys::ItemPointerData>,
    change: impl FnOnce(&dyn Fn(&CStr) -> Option<pg_sys::Datum>) -> (Vec<Column<'static>>, R),
) -> (R, pg_sys::ItemPointerData) {
    let table = Table::open(relid);
    // SAFETY: the tuple and its modified copy are used while the scan and the relation are
    // open; SnapshotSelf is a static of PostgreSQL's.
    unsafe {
        with_singleton(
            &table,
            table_name,
            &raw mut pg_sys::SnapshotSelfData,
            hint,
            |tuple| {
                let (columns, result) = change(&|name: &CStr| table.get(tuple, name));
                let new = table.modify(tuple, &columns);
                if table.has_added_checks() {
                    Executor::new(&table, false).check(new);
                }
                let indexes = Indexes::open(&table);
                pg_sys::CatalogTupleUpdateWithInfo(table.0, &mut (*tuple).t_self, new, indexes.0);
                // Later statements of this transaction see the new row, as after an UPDATE.
                pg_sys::CommandCounterIncrement();
                (result, (*new).t_self)
            },
        )
    }
}

/// Stamps `version` again on rows of `relid` (the directory's table, which has triggers of its
/// own: the rewrite fires none) that this transaction wrote, its indexes kept as the executor
/// keeps them (partial and expression indexes included). A row a later statement of this
/// transaction has changed since is left alone: that statement stamps its own.
pub fn stamp_own_rows(
    relid: pg_sys::Oid,
    rows: impl IntoIterator<Item = pg_sys::ItemPointerData>,
    version: i64,
) {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return;
    }
    let table = Table::open(relid);
    let column = [(c"version", version.into_datum())];
    let executor = Executor::new(&table, true);
    // SAFETY: each fetched tuple is read under its buffer pin, and its new version written
    // before the next is fetched.
    unsafe {
        // The rows were written under earlier command ids: the updates need a later one.
        pg_sys::CommandCounterIncrement();
        for tid in rows {
            let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
            tuple.t_self = tid;
            let mut buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
            let snapshot = &raw mut pg_sys::SnapshotSelfData;
            if !pg_sys::heap_fetch(table.0, snapshot, &mut tuple, &mut buffer, false) {
                continue;
            }
            let new = table.modify(&mut tuple, &column);
            pg_sys::ReleaseBuffer(buffer);
            #[cfg(feature = "pg15")]
            pg_sys::simple_heap_update(table.0, &mut tuple.t_self, new);
            // 16 also says which indexes the update needs; HEAP_ONLY_TUPLE below says the same
            // for the directory's (b-tree only).
            #[cfg(not(feature = "pg15"))]
            {
                let mut indexes = pg_sys::TU_UpdateIndexes::TU_All;
                pg_sys::simple_heap_update(table.0, &mut tuple.t_self, new, &mut indexes);
            }
            if (*(*new).t_data).t_infomask2 & pg_sys::HEAP_ONLY_TUPLE as u16 == 0 {
                // Not a HOT update: the indexes must point at the new version too.
                executor.insert_index_entries(new);
            }
        }
    }
}
