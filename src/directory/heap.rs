//! The directory's bookkeeping rows (its version, its history), written straight to the heap as
//! PostgreSQL writes its catalogs, and as Citus writes its metadata tables: no statement, no
//! executor, no plan. These writes are on every directory change's path, and running them as SQL
//! through SPI cost more than the rest of the change (a `perf` profile of `bench_directory`).
//! `changes_since`, which every router calls on every change, reads them the same way.
//!
//! What SQL would have done is ours to do: every column gets a value (an identity from its
//! sequence), the values written are ones the tables' CHECK constraints accept, the indexes are
//! kept, and the version row is written under the lock that orders versions. No trigger fires
//! and no privilege is checked: these are the extension's own writes, made for a writer who
//! holds no privilege on these tables.

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

/// A table of the extension opened for writing (`RowExclusiveLock`, kept until the transaction
/// ends, as the executor keeps it).
struct Table(pg_sys::Relation);

impl Table {
    fn open(relid: pg_sys::Oid) -> Table {
        Table(unsafe { pg_sys::table_open(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) })
    }

    /// Opened for reading only (`AccessShareLock`: a standby grants no other).
    fn open_to_read(relid: pg_sys::Oid) -> Table {
        Table(unsafe { pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) })
    }

    fn relid(&self) -> pg_sys::Oid {
        unsafe { (*self.0).rd_id }
    }

    fn attributes(&self) -> &[pg_sys::FormData_pg_attribute] {
        // SAFETY: the descriptor lives as long as the relation is open.
        unsafe {
            let desc = (*self.0).rd_att;
            (*desc).attrs.as_slice((*desc).natts as usize)
        }
    }

    /// The position (from 1) of column `name`; an error naming it when the table has none, or
    /// when it is not of the type it is read and written as.
    fn attnum(&self, name: &CStr) -> i32 {
        let attnum = unsafe { pg_sys::SPI_fnumber((*self.0).rd_att, name.as_ptr()) };
        if attnum <= 0 {
            self.broken(format!("no column {name:?}"));
        }
        columns::check(
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

    /// The row's values and nulls in the table's column order. A column not in `columns` gets
    /// its identity's next value, or NULL where NULL is allowed.
    fn form(&self, columns: &[Column<'_>]) -> (Vec<pg_sys::Datum>, Vec<bool>) {
        let mut values = Vec::with_capacity(self.attributes().len());
        let mut nulls = Vec::with_capacity(self.attributes().len());
        for (i, attr) in self.attributes().iter().enumerate() {
            let name = unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) };
            let given = columns.iter().find(|(c, _)| *c == name).map(|(_, v)| *v);
            let value = match given {
                _ if attr.attisdropped => None,
                Some(value) => value,
                None if attr.attidentity != 0 => Some(self.next_identity(i)),
                None => None,
            };
            if value.is_some() {
                columns::check(unsafe { (*self.0).rd_att }, attr);
            }
            if value.is_none() && attr.attnotnull && !attr.attisdropped {
                self.broken(format!("no value for its NOT NULL column {name:?}"));
            }
            values.push(value.unwrap_or(pg_sys::Datum::from(0)));
            nulls.push(value.is_none());
        }
        (values, nulls)
    }

    /// Column `name` of `tuple`, a tuple of this table; `None` when NULL.
    ///
    /// # Safety
    /// `tuple` is a valid tuple of this table.
    unsafe fn get(&self, tuple: pg_sys::HeapTuple, name: &CStr) -> Option<pg_sys::Datum> {
        let mut is_null = false;
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
        unsafe { modified(tuple, (*self.0).rd_att, &at) }
    }

    fn next_identity(&self, index: usize) -> pg_sys::Datum {
        let column = (self.relid(), (index + 1) as i16);
        let sequence = match IDENTITY.get() {
            Some((known, sequence)) if known == column => sequence,
            _ => {
                // Found through pg_depend: a scan worth doing once per backend, not per row. A
                // table made anew (the extension re-created) has a new OID, so a new lookup.
                let sequence = unsafe { pg_sys::getIdentitySequence(column.0, column.1, false) };
                IDENTITY.set(Some((column, sequence)));
                sequence
            }
        };
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
            let infos = std::slice::from_raw_parts(
                (*state.0).ri_IndexRelationInfo,
                (*state.0).ri_NumIndices.max(0) as usize,
            );
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
        unsafe { pg_sys::CatalogCloseIndexes(self.0) }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        unsafe { pg_sys::table_close(self.0, pg_sys::NoLock as pg_sys::LOCKMODE) }
    }
}

/// Inserts one row into `relid`, indexes included.
pub fn insert(relid: pg_sys::Oid, columns: &[Column<'_>]) {
    let table = Table::open(relid);
    let (mut values, mut nulls) = table.form(columns);
    // SAFETY: the descriptor matches `values` and `nulls` (one per attribute); the tuple is
    // palloc'd in the current context and freed with it.
    unsafe {
        let tuple =
            pg_sys::heap_form_tuple((*table.0).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::CatalogTupleInsertWithInfo(table.0, tuple, Indexes::open(&table).0);
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
            pg_sys::RelationGetPrimaryKeyIndex(table.0),
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
                let indexes = Indexes::open(&table);
                pg_sys::CatalogTupleUpdateWithInfo(table.0, &mut (*tuple).t_self, new, indexes.0);
                // Later statements of this transaction see the new row, as after an UPDATE.
                pg_sys::CommandCounterIncrement();
                (result, (*new).t_self)
            },
        )
    }
}

/// Rewrites columns of a row the running statement wrote to `relation` (a table with triggers of
/// its own: the rewrite fires none), its indexes kept as the executor keeps them (partial and
/// expression indexes included). A row a later statement of this transaction has changed since
/// is left alone: that statement wrote its own values.
pub fn rewrite_own_row(
    relation: pg_sys::Relation,
    tid: pg_sys::ItemPointerData,
    columns: &[Column<'_>],
) {
    // The trigger's relation: open, and closed by its caller.
    let table = std::mem::ManuallyDrop::new(Table(relation));
    // SAFETY: the fetched tuple is read under its buffer pin; the executor state and the index
    // relations live until they are freed and closed here.
    unsafe {
        // The row was written under the statement's command id: the update needs a later one.
        pg_sys::CommandCounterIncrement();
        let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
        tuple.t_self = tid;
        let mut buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
        let snapshot = &raw mut pg_sys::SnapshotSelfData;
        if !pg_sys::heap_fetch(relation, snapshot, &mut tuple, &mut buffer, false) {
            return;
        }
        let new = table.modify(&mut tuple, columns);
        pg_sys::ReleaseBuffer(buffer);
        pg_sys::simple_heap_update(relation, &mut tuple.t_self, new);
        if (*(*new).t_data).t_infomask2 & pg_sys::HEAP_ONLY_TUPLE as u16 != 0 {
            return; // a HOT update: the indexes still point at the row's chain
        }
        let estate = pg_sys::CreateExecutorState();
        let info: *mut pg_sys::ResultRelInfo =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()).cast();
        (*info).type_ = pg_sys::NodeTag::T_ResultRelInfo;
        pg_sys::InitResultRelInfo(info, relation, 0, std::ptr::null_mut(), 0);
        pg_sys::ExecOpenIndices(info, false);
        let slot = pg_sys::MakeSingleTupleTableSlot(
            (*relation).rd_att,
            &raw const pg_sys::TTSOpsHeapTuple,
        );
        pg_sys::ExecStoreHeapTuple(new, slot, false);
        pg_sys::ExecInsertIndexTuples(
            info,
            slot,
            estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::ExecCloseIndices(info);
        pg_sys::FreeExecutorState(estate);
    }
}
