//! An INSERT into a protected table, checked by the executor instead of the triggers.
//!
//! A trigger costs PostgreSQL a function lookup and a call per statement, and an AFTER ROW
//! trigger queues every row and fetches it back: 12% more instructions on a one-row INSERT
//! transaction (`bench_check`). When a query starts, this hook finds the INSERT whose table the
//! triggers protect, takes INSERT out of this query's copy of those triggers (the catalog's, and
//! so `pg_dump`, COPY, UPDATE, DELETE, TRUNCATE and every other statement, keep them), checks the
//! request once, and reads each row's key as the plan hands it to the INSERT; the same for each
//! INSERT inside a `WITH` query.
//!
//! It takes the row trigger's place only where it sees the row the trigger would: a plain table,
//! no BEFORE ROW INSERT trigger that could change the key, and a key column that is not
//! generated. With `ON CONFLICT` it checks every proposed row, the ones that conflict too (a
//! stale route must not learn "nothing inserted" from a shard its tenant left); the UPDATE of `DO
//! UPDATE` keeps its row trigger, and loses the statement trigger, whose request the hook has
//! checked. A partitioned table routes its rows to partitions whose own row triggers fire and
//! check each row written; the hook takes its statement trigger's place and checks each proposed
//! row too, so that there as well a conflicting one is not let through. Everywhere else the
//! triggers fire as before, and the row trigger sees only the rows written. Where a trigger would
//! not fire (disabled, or `session_replication_role = replica` for a trigger enabled on origin),
//! the hook checks nothing either.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::rc::Rc;

use foldhash::HashMap;
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::check::{self, Access, ROW_TRIGGER, STATEMENT_TRIGGER};
use super::key::Form;
use crate::catalog;
use crate::entity::EntityRef;

static mut PREVIOUS: pg_sys::ExecutorStart_hook_type = None;

pub fn init() {
    unsafe {
        PREVIOUS = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache), pg_sys::Datum::from(0));
    }
}

/// What the hook knows of a table whose INSERTs it can check: kept until the table's relcache
/// entry changes, since finding it out costs more than the check itself.
struct Protection {
    /// The `pg_trigger` OID of the statement trigger.
    statement: pg_sys::Oid,
    /// Where each row's key is checked besides the hook, and how the hook reads it.
    row: Option<(RowTrigger, RowKey)>,
}

/// The row trigger that checks a row when the hook does not.
enum RowTrigger {
    /// The table's own, by its `pg_trigger` OID: the hook takes its place.
    Own(pg_sys::Oid),
    /// A partitioned table's partitions' own, which still check each row written.
    Partitions,
}

/// How a row's key is read: its column and type, and its entity type.
struct RowKey {
    attno: i32,
    text: KeyText,
    entity_type: String,
}

/// The key's text, as the row trigger reads it (its type's output, in its form), without a call
/// of the output function for the common key types.
enum KeyText {
    Integer(pg_sys::Oid),
    Text(Form),
    Uuid,
    /// Any other key type: its output function, looked up once, in `CacheMemoryContext`.
    Output(Box<pg_sys::FmgrInfo>, Form),
}

thread_local! {
    /// By table: `None` for a table whose INSERTs the triggers check.
    static PROTECTIONS: RefCell<HashMap<pg_sys::Oid, Option<Rc<Protection>>>> =
        RefCell::new(HashMap::default());
    /// Set by the relcache callback when it found `PROTECTIONS` borrowed: forget every table.
    static FORGET_ALL: Cell<bool> = const { Cell::new(false) };
    /// The plan nodes being watched, innermost last: an INSERT can run inside another's
    /// expressions. Each leaves when its query's memory goes (at its end, or its abort).
    static WATCHED: RefCell<Vec<Watched>> = const { RefCell::new(Vec::new()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    PROTECTIONS.with(|p| match p.try_borrow_mut() {
        Ok(mut p) if relid != pg_sys::InvalidOid => {
            p.remove(&relid);
        }
        Ok(mut p) => p.clear(),
        Err(_) => FORGET_ALL.set(true),
    });
}

/// What one INSERT's plan node needs to check each row it hands over.
struct Watched {
    node: *mut pg_sys::PlanState,
    /// The node's own function, which this one wraps.
    real: pg_sys::ExecProcNodeMtd,
    /// The key's position in the node's output.
    column: i32,
    protection: Rc<Protection>,
    version: Option<i64>,
}

#[pg_guard]
unsafe extern "C-unwind" fn executor_start(query: *mut pg_sys::QueryDesc, eflags: i32) {
    unsafe {
        match PREVIOUS {
            Some(previous) => previous(query, eflags),
            None => pg_sys::standard_ExecutorStart(query, eflags),
        }
        if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 || (*query).estate.is_null() {
            return;
        }
        for node in modify_nodes(query) {
            take_over(node);
        }
    }
}

/// The query's plan nodes that may INSERT, each once: the query's own when it is an INSERT, and
/// those the executor lists apart, an INSERT inside WITH and the INSERT of a rule's action. A
/// rule's INSERT does not set the command's tag, so the executor lists its node in both places:
/// wrapped twice, its rows' function called itself until the stack overflowed.
///
/// # Safety
/// `query` has been started by the executor.
unsafe fn modify_nodes(query: *mut pg_sys::QueryDesc) -> Vec<*mut pg_sys::PlanState> {
    unsafe {
        let mut nodes = Vec::new();
        if (*query).operation == pg_sys::CmdType::CMD_INSERT {
            nodes.push((*query).planstate);
        }
        for cell in catalog::list_cells((*(*query).estate).es_auxmodifytables) {
            nodes.push(cell.ptr_value.cast());
        }
        let mut once = Vec::with_capacity(nodes.len());
        for node in nodes {
            if !node.is_null() && !once.contains(&node) {
                once.push(node);
            }
        }
        once
    }
}

/// Whether a trigger fires in this session, as PostgreSQL's `TriggerEnabled` decides it.
fn fires(trigger: &pg_sys::Trigger) -> bool {
    let replica = unsafe { pg_sys::SessionReplicationRole }
        == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
    match trigger.tgenabled as u8 {
        pg_sys::TRIGGER_DISABLED => false,
        pg_sys::TRIGGER_FIRES_ON_ORIGIN => !replica,
        pg_sys::TRIGGER_FIRES_ON_REPLICA => replica,
        _ => true,
    }
}

/// The trigger `name` calling our `function` for INSERT at `level` (row bit and timing).
fn ours<'d>(
    triggers: &'d [pg_sys::Trigger],
    name: &CStr,
    function: &'static CStr,
    level: u32,
) -> Option<&'d pg_sys::Trigger> {
    let function = catalog::function(function)?;
    triggers.iter().find(|t| {
        t.tgfoid == function
            && unsafe { CStr::from_ptr(t.tgname) } == name
            && t.tgtype as u32 & (pg_sys::TRIGGER_TYPE_ROW | pg_sys::TRIGGER_TYPE_TIMING_MASK)
                == level
            && t.tgtype as u32 & pg_sys::TRIGGER_TYPE_INSERT != 0
    })
}

/// The flags PostgreSQL derives from the triggers' types that this module's changes can clear.
fn refresh_flags(desc: &mut pg_sys::TriggerDesc, triggers: &[pg_sys::Trigger]) {
    let any = |event: u32, level: u32| {
        triggers.iter().any(|t| {
            let t = t.tgtype as u32;
            t & event != 0
                && t & (pg_sys::TRIGGER_TYPE_ROW | pg_sys::TRIGGER_TYPE_TIMING_MASK) == level
        })
    };
    let (insert, update) = (pg_sys::TRIGGER_TYPE_INSERT, pg_sys::TRIGGER_TYPE_UPDATE);
    desc.trig_insert_before_statement = any(insert, pg_sys::TRIGGER_TYPE_BEFORE);
    desc.trig_insert_after_row = any(
        insert,
        pg_sys::TRIGGER_TYPE_ROW | pg_sys::TRIGGER_TYPE_AFTER,
    );
    desc.trig_update_before_statement = any(update, pg_sys::TRIGGER_TYPE_BEFORE);
}

/// What the hook can do for INSERTs into `relation`, found out from its triggers and key column.
unsafe fn protection_of(relation: pg_sys::Relation) -> Option<Protection> {
    unsafe {
        let desc = (*relation).trigdesc;
        let partitioned = match (*(*relation).rd_rel).relkind as u8 {
            pg_sys::RELKIND_RELATION => false,
            pg_sys::RELKIND_PARTITIONED_TABLE => true,
            _ => return None,
        };
        // A BEFORE ROW trigger could change the key after the hook read it; on a partitioned
        // table the partitions' row triggers read it after that.
        if desc.is_null() || (*desc).trig_insert_before_row && !partitioned {
            return None;
        }
        let triggers = catalog::slice((*desc).triggers, (*desc).numtriggers);
        let statement = ours(
            triggers,
            STATEMENT_TRIGGER,
            c"shard_directory_protect_statement",
            pg_sys::TRIGGER_TYPE_BEFORE,
        )?;
        // A partitioned table's statement trigger carries the key its partitions' row triggers
        // check.
        let row = if partitioned {
            Some((RowTrigger::Partitions, statement))
        } else {
            ours(
                triggers,
                ROW_TRIGGER,
                c"shard_directory_protect_row",
                pg_sys::TRIGGER_TYPE_ROW | pg_sys::TRIGGER_TYPE_AFTER,
            )
            .map(|t| (RowTrigger::Own(t.tgoid), t))
        };
        let row = match row.map(|(trigger, t)| (trigger, check::key_arguments(t))) {
            Some((trigger, Some((key_column, entity_type)))) => {
                let attno = check::key_attno(relation, key_column);
                let attr = &catalog::attributes((*relation).rd_att)[attno as usize - 1];
                if attr.attgenerated != 0 {
                    return None;
                }
                let text = key_text(attr.atttypid, check::key_form(relation, attno));
                let entity_type = entity_type.to_string_lossy().into_owned();
                Some((
                    trigger,
                    RowKey {
                        attno,
                        text,
                        entity_type,
                    },
                ))
            }
            // A row trigger without a key checks only what the statement's check does.
            _ => None,
        };
        Some(Protection {
            statement: statement.tgoid,
            row,
        })
    }
}

fn key_text(typoid: pg_sys::Oid, form: Form) -> KeyText {
    match typoid {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => KeyText::Integer(typoid),
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => KeyText::Text(form),
        pg_sys::UUIDOID => KeyText::Uuid,
        _ => unsafe {
            let (mut function, mut varlena) = (pg_sys::InvalidOid, false);
            pg_sys::getTypeOutputInfo(typoid, &mut function, &mut varlena);
            let mut output = Box::new(pg_sys::FmgrInfo::default());
            pg_sys::fmgr_info_cxt(function, &mut *output, pg_sys::CacheMemoryContext);
            KeyText::Output(output, form)
        },
    }
}

/// The table's protection, from the cache or found out now.
unsafe fn cached_protection(relation: pg_sys::Relation) -> Option<Rc<Protection>> {
    let relid = unsafe { (*relation).rd_id };
    if FORGET_ALL.replace(false) {
        PROTECTIONS.with_borrow_mut(HashMap::clear);
    }
    if let Some(known) = PROTECTIONS.with_borrow(|p| p.get(&relid).cloned()) {
        return known;
    }
    let found = unsafe { protection_of(relation) }.map(Rc::new);
    PROTECTIONS.with_borrow_mut(|p| p.insert(relid, found.clone()));
    found
}

unsafe fn take_over(planstate: *mut pg_sys::PlanState) {
    unsafe {
        if planstate.is_null() || (*planstate).type_ != pg_sys::NodeTag::T_ModifyTableState {
            return;
        }
        let modify = planstate as *mut pg_sys::ModifyTableState;
        let info = (*modify).resultRelInfo;
        if (*modify).operation != pg_sys::CmdType::CMD_INSERT
            || (*modify).mt_nrels != 1
            || info != (*modify).rootResultRelInfo
            || (*info).ri_TrigDesc.is_null()
        {
            return;
        }
        let Some(protection) = cached_protection((*info).ri_RelationDesc) else {
            return;
        };
        // This query's copy of the triggers: whether ours fire here, and where to take INSERT out.
        let desc = &mut *(*info).ri_TrigDesc;
        let triggers = catalog::slice_mut(desc.triggers, desc.numtriggers);
        let find = |oid: pg_sys::Oid| triggers.iter().position(|t| t.tgoid == oid && fires(t));
        let Some(statement) = find(protection.statement) else {
            return;
        };
        // The row trigger the hook replaces, if any, and whether it reads rows at all.
        let row = match &protection.row {
            Some((RowTrigger::Own(trigger), key)) => find(*trigger).map(|i| (Some(i), key)),
            Some((RowTrigger::Partitions, key)) => Some((None, key)),
            None => None,
        };
        let row = match row {
            Some((replaced, key)) => {
                let Some(column) = output_column((*planstate).lefttree, key.attno) else {
                    return;
                };
                Some((replaced, column))
            }
            None => None,
        };
        for i in [Some(statement), row.and_then(|r| r.0)]
            .into_iter()
            .flatten()
        {
            triggers[i].tgtype &= !(pg_sys::TRIGGER_TYPE_INSERT as i16);
        }
        // `DO UPDATE` fires the statement triggers for UPDATE too: the request checked here is
        // all ours would check. The row trigger still checks each row the UPDATE writes.
        let plan = (*planstate).plan as *mut pg_sys::ModifyTable;
        if (*plan).onConflictAction == pg_sys::OnConflictAction::ONCONFLICT_UPDATE {
            triggers[statement].tgtype &= !(pg_sys::TRIGGER_TYPE_UPDATE as i16);
        }
        refresh_flags(desc, triggers);
        let version = check::check_request(Access::Write);
        if let Some((_, column)) = row {
            watch_rows((*planstate).lefttree, column, protection, version);
        }
    }
}

/// Where the plan node under an INSERT puts the table's column `attno`: its non-junk columns are
/// the table's, in order.
unsafe fn output_column(node: *mut pg_sys::PlanState, attno: i32) -> Option<i32> {
    unsafe {
        if node.is_null() {
            return None;
        }
        if (*node).plan.is_null() {
            return None;
        }
        let column = catalog::list_cells((*(*node).plan).targetlist)
            .iter()
            .map(|e| e.ptr_value as *const pg_sys::TargetEntry)
            .filter(|t| !(**t).resjunk)
            .nth(attno as usize - 1)
            .map(|t| (*t).resno as i32);
        column
    }
}

unsafe fn watch_rows(
    node: *mut pg_sys::PlanState,
    column: i32,
    protection: Rc<Protection>,
    version: Option<i64>,
) {
    unsafe {
        // Each node is wrapped once (`modify_nodes`); should it come again, the wrapper would
        // wrap itself.
        if WATCHED.with_borrow(|w| w.iter().any(|w| w.node == node)) {
            return;
        }
        // ExecProcNodeFirst replaces `ExecProcNode` on the first call; `ExecProcNodeReal` is what
        // it, and the instrumented variant, call.
        let real = (*node).ExecProcNodeReal;
        if real.is_none_or(is_checked_row) {
            return;
        }
        WATCHED.with_borrow_mut(|w| {
            w.push(Watched {
                node,
                real,
                column,
                protection,
                version,
            })
        });
        (*node).ExecProcNodeReal = Some(checked_row);
        let memory = (*(*node).state).es_query_cxt;
        let callback = pg_sys::MemoryContextAlloc(
            memory,
            std::mem::size_of::<pg_sys::MemoryContextCallback>(),
        ) as *mut pg_sys::MemoryContextCallback;
        (*callback).func = Some(unwatch);
        (*callback).arg = node.cast();
        pg_sys::MemoryContextRegisterResetCallback(memory, callback);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn unwatch(node: *mut std::ffi::c_void) {
    WATCHED.with_borrow_mut(|w| {
        if let Some(i) = w.iter().rposition(|w| w.node.cast() == node) {
            w.remove(i);
        }
    });
}

/// Runs `f` in the statement's per-row memory, which the INSERT empties before its next row.
unsafe fn in_row_memory<R>(estate: *mut pg_sys::EState, f: impl FnOnce() -> R) -> R {
    unsafe {
        let context = if (*estate).es_per_tuple_exprcontext.is_null() {
            pg_sys::MakePerTupleExprContext(estate)
        } else {
            (*estate).es_per_tuple_exprcontext
        };
        let previous = pg_sys::MemoryContextSwitchTo((*context).ecxt_per_tuple_memory);
        let r = f();
        pg_sys::MemoryContextSwitchTo(previous);
        r
    }
}

/// The key's text, as the type's output function would print it, in the form its equality
/// compares; `buffer` holds it when it is made here.
unsafe fn read_key<'b>(
    text: &KeyText,
    datum: pg_sys::Datum,
    estate: *mut pg_sys::EState,
    buffer: &'b mut Vec<u8>,
) -> &'b [u8] {
    use std::io::Write;
    buffer.clear();
    unsafe {
        match text {
            KeyText::Integer(typoid) => {
                let n = match *typoid {
                    pg_sys::INT2OID => i64::from(datum.value() as i16),
                    pg_sys::INT4OID => i64::from(datum.value() as i32),
                    _ => datum.value() as i64,
                };
                let _ = write!(buffer, "{n}");
                buffer
            }
            KeyText::Text(form) => {
                let mut value = datum.cast_mut_ptr::<pg_sys::varlena>();
                let inline = pgrx::varlena::varatt_is_4b_u(value)
                    || (pgrx::varlena::varatt_is_1b(value)
                        && !pgrx::varlena::varatt_is_1b_e(value));
                if !inline {
                    value = in_row_memory(estate, || pg_sys::pg_detoast_datum_packed(value));
                }
                buffer.extend_from_slice(form.text(pgrx::varlena::varlena_to_byte_slice(value)));
                buffer
            }
            KeyText::Uuid => {
                let bytes = catalog::slice(datum.cast_mut_ptr::<u8>(), 16);
                for (i, b) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        buffer.push(b'-');
                    }
                    let _ = write!(buffer, "{b:02x}");
                }
                buffer
            }
            KeyText::Output(output, form) => {
                let output = &**output as *const pg_sys::FmgrInfo as *mut pg_sys::FmgrInfo;
                let text = in_row_memory(estate, || pg_sys::OutputFunctionCall(output, datum));
                buffer.extend_from_slice(form.text(CStr::from_ptr(text).to_bytes()));
                buffer
            }
        }
    }
}

thread_local! {
    /// The key's text when it is made here (an integer's, a uuid's): reused from row to row.
    static KEY_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

type NodeFunction =
    unsafe extern "C-unwind" fn(*mut pg_sys::PlanState) -> *mut pg_sys::TupleTableSlot;

fn is_checked_row(f: NodeFunction) -> bool {
    std::ptr::fn_addr_eq(f, checked_row as NodeFunction)
}

/// The watched node's next row, its key checked against its entity's fence first.
#[pg_guard]
unsafe extern "C-unwind" fn checked_row(
    node: *mut pg_sys::PlanState,
) -> *mut pg_sys::TupleTableSlot {
    // A plan nests INSERTs only as deep as the stack lets PostgreSQL's own recursion go: an
    // error past that, never an overflow.
    unsafe { pg_sys::check_stack_depth() };
    // Copied out, so no borrow is held while the check runs (it may query, and raise).
    let watched = WATCHED.with_borrow(|w| {
        w.iter()
            .rev()
            .find(|w| w.node == node)
            .map(|w| (w.real, w.column, w.protection.clone(), w.version))
    });
    // Only nodes this module watches run this function, and only while they are watched; the
    // function it wraps is never itself (`watch_rows`).
    let (real, column, protection, version) = watched.expect("a watched INSERT plan node");
    let real = real
        .filter(|real| !is_checked_row(*real))
        .expect("the watched node's own function");
    let key = &protection
        .row
        .as_ref()
        .expect("a watched INSERT has a row key")
        .1;
    unsafe {
        let slot = real(node);
        if slot.is_null() || (*slot).tts_flags as u32 & pg_sys::TTS_FLAG_EMPTY != 0 {
            return slot;
        }
        let mut null = false;
        let datum = pg_sys::slot_getattr(slot, column, &mut null);
        if null {
            return slot;
        }
        let mut buffer = KEY_BUFFER.take();
        let id = read_key(&key.text, datum, (*node).state, &mut buffer);
        let id = String::from_utf8_lossy(id);
        check::check_row_entity(
            EntityRef {
                entity_type: &key.entity_type,
                entity_id: &id,
            },
            version,
        );
        drop(id);
        KEY_BUFFER.set(buffer);
        slot
    }
}
