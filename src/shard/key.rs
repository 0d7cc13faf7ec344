//! Which column types may key an entity, and the one text form of a key that the check, the
//! fences and the mover all compare.
//!
//! The check matches a row to its entity by the key's text; the mover selects the entity's rows
//! with SQL equality on the key column. The two agree only where two keys are equal exactly when
//! their texts are, whatever the session's settings: `text`, `varchar` and `char(n)` in a
//! deterministic collation (`char(n)` without its padding, which its equality ignores), the
//! integers, `numeric` with scale 0, `uuid`, enums, and domains over these. Anything else
//! (`citext`, a case-insensitive collation, `numeric` with a fraction, a `date` whose text
//! follows `DateStyle`, ...) is refused when it is protected, and again if a column is altered
//! to it later.
//!
//! An entity id is then valid for a key column only in its canonical form: the text the column
//! gives back for it (`8842`, not `08842`; a uuid in lower case). Fences accept only canonical
//! ids, so a row's key, which is always canonical, finds its entity's fence.

use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::error::{spi, SdError};

/// A protected table's key column, as the rules need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    /// `schema.table.column`, for messages.
    pub name: String,
    pub typoid: pg_sys::Oid,
    pub typmod: i32,
    pub collation: pg_sys::Oid,
}

/// How a key's text is read from its type's output: as it is, or without `char(n)`'s padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Exact,
    Unpadded,
}

impl Form {
    /// The key's text from its type's output.
    pub fn text(self, output: &[u8]) -> &[u8] {
        match self {
            Form::Exact => output,
            Form::Unpadded => {
                let end = output.iter().rposition(|b| *b != b' ').map_or(0, |i| i + 1);
                &output[..end]
            }
        }
    }
}

/// The scale a `numeric` type modifier fixes, if it fixes one (PostgreSQL's
/// `NUMERIC_TYPMOD_SCALE`, which since 15 may be negative).
fn numeric_scale(typmod: i32) -> Option<i32> {
    let header = pg_sys::VARHDRSZ as i32;
    (typmod >= header).then(|| (((typmod - header) & 0x7ff) ^ 1024) - 1024)
}

fn deterministic(collation: pg_sys::Oid) -> bool {
    collation == pg_sys::InvalidOid
        || collation == pg_sys::DEFAULT_COLLATION_OID
        || collation == pg_sys::C_COLLATION_OID
        || unsafe { pg_sys::get_collation_isdeterministic(collation) }
}

/// The type as `format_type` prints it, with its modifier.
pub fn type_name(typoid: pg_sys::Oid, typmod: i32) -> String {
    unsafe { CStr::from_ptr(pg_sys::format_type_with_typemod(typoid, typmod)) }
        .to_string_lossy()
        .into_owned()
}

/// How keys of this column compare, or why its type cannot key an entity.
pub fn form(column: &KeyColumn) -> Result<Form, &'static str> {
    if !deterministic(column.collation) {
        return Err("its collation is nondeterministic, so keys whose texts differ can be equal");
    }
    let mut typmod = column.typmod;
    let base = unsafe { pg_sys::getBaseTypeAndTypmod(column.typoid, &mut typmod) };
    match base {
        pg_sys::TEXTOID | pg_sys::VARCHAROID => Ok(Form::Exact),
        pg_sys::BPCHAROID => Ok(Form::Unpadded),
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID | pg_sys::UUIDOID => Ok(Form::Exact),
        pg_sys::NUMERICOID if numeric_scale(typmod) == Some(0) => Ok(Form::Exact),
        pg_sys::NUMERICOID => Err(
            "numeric keys equal as numbers print differently (1.0 and 1.00): only numeric(p, 0) \
             has one text per value",
        ),
        _ if unsafe { pg_sys::get_typtype(base) } as u8 == pg_sys::TYPTYPE_ENUM => Ok(Form::Exact),
        _ => Err(
            "its equality is not the equality of its text in every session (it may ignore case, \
             or print according to DateStyle, TimeZone, bytea_output or extra_float_digits)",
        ),
    }
}

/// The form of a key column, or the error that refuses it (`protect`, or a column altered since).
pub fn require_form(column: &KeyColumn) -> Form {
    form(column).unwrap_or_else(|why| {
        SdError::UnsupportedKeyType {
            column: column.name.clone(),
            type_name: type_name(column.typoid, column.typmod),
            why,
        }
        .raise()
    })
}

/// The row trigger's fast path: the form of a key column of a built-in type in a built-in
/// collation, without a catalog lookup; `None` for the rest, which [`form`] decides.
pub fn builtin_form(typoid: pg_sys::Oid, typmod: i32, collation: pg_sys::Oid) -> Option<Form> {
    let plain_collation = collation == pg_sys::InvalidOid
        || collation == pg_sys::DEFAULT_COLLATION_OID
        || collation == pg_sys::C_COLLATION_OID;
    match typoid {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID | pg_sys::UUIDOID => Some(Form::Exact),
        pg_sys::TEXTOID | pg_sys::VARCHAROID if plain_collation => Some(Form::Exact),
        pg_sys::BPCHAROID if plain_collation => Some(Form::Unpadded),
        pg_sys::NUMERICOID if numeric_scale(typmod) == Some(0) => Some(Form::Exact),
        _ => None,
    }
}

/// What an input error raised while reading an entity id as a key says about where it came from.
struct Context {
    message: CString,
}

extern "C-unwind" {
    /// PostgreSQL's `errcontext_msg` (variadic, so not in pgrx's bindings).
    fn errcontext_msg(fmt: *const std::ffi::c_char, ...) -> std::ffi::c_int;
}

#[pg_guard]
unsafe extern "C-unwind" fn add_context(arg: *mut std::ffi::c_void) {
    let context = &*(arg as *const Context);
    errcontext_msg(c"%s".as_ptr(), context.message.as_ptr());
}

/// The canonical text of `entity_id` as a key of `column`: the type's input (with the column's
/// modifier, so a `char(8)` refuses nine characters), then its output in `form`. An id the type
/// cannot read raises the type's own error (22P02, 22001, a domain's 23514), with a CONTEXT line
/// naming the column.
pub fn canonical(column: &KeyColumn, form: Form, entity_id: &str) -> String {
    let Ok(id) = CString::new(entity_id) else {
        SdError::NullValue {
            what: "a zero byte in entity_id",
        }
        .raise()
    };
    let mut context = Context {
        message: CString::new(format!(
            "reading entity id \"{}\" as a key of {} ({})",
            entity_id.replace('\0', ""),
            column.name,
            type_name(column.typoid, column.typmod)
        ))
        .unwrap_or_default(),
    };
    // PostgreSQL calls the context callbacks as it raises; the guard takes the callback off the
    // stack again also when the error unwinds through here.
    struct Pushed(*mut pg_sys::ErrorContextCallback);
    impl Drop for Pushed {
        fn drop(&mut self) {
            unsafe { pg_sys::error_context_stack = (*self.0).previous };
        }
    }
    let mut callback = pg_sys::ErrorContextCallback {
        previous: unsafe { pg_sys::error_context_stack },
        callback: Some(add_context),
        arg: (&mut context as *mut Context).cast(),
    };
    unsafe { pg_sys::error_context_stack = &mut callback };
    let _pushed = Pushed(&mut callback);
    unsafe {
        let (mut input, mut ioparam, mut output, mut varlena) = (
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            false,
        );
        pg_sys::getTypeInputInfo(column.typoid, &mut input, &mut ioparam);
        let value =
            pg_sys::OidInputFunctionCall(input, id.as_ptr().cast_mut(), ioparam, column.typmod);
        pg_sys::getTypeOutputInfo(column.typoid, &mut output, &mut varlena);
        let text = CStr::from_ptr(pg_sys::OidOutputFunctionCall(output, value));
        String::from_utf8_lossy(form.text(text.to_bytes())).into_owned()
    }
}

/// A key column from a row of `(name, atttypid, atttypmod, attcollation)`.
fn from_row(r: &pgrx::spi::SpiHeapTupleData<'_>) -> Result<KeyColumn, pgrx::spi::SpiError> {
    Ok(KeyColumn {
        name: r.get::<String>(1)?.unwrap_or_default(),
        typoid: r.get::<pg_sys::Oid>(2)?.unwrap_or(pg_sys::InvalidOid),
        typmod: r.get::<i32>(3)?.unwrap_or(-1),
        collation: r.get::<pg_sys::Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
    })
}

/// Key columns of protected tables, those `condition` (on `p.entity_type`, `p.tbl`) selects.
fn protected_columns(condition: &str, arg: pgrx::datum::DatumWithOid) -> Vec<KeyColumn> {
    let sql = format!(
        "SELECT format('%s.%I', p.tbl, p.key_column), a.atttypid, a.atttypmod, a.attcollation \
         FROM shard_directory.protected_tables() p \
         JOIN pg_catalog.pg_attribute a ON a.attrelid = p.tbl AND a.attname = p.key_column \
         WHERE {condition} ORDER BY 1"
    );
    spi(
        "read the key columns of protected tables",
        Spi::connect(|c| {
            c.select(&sql, None, &[arg])?
                .map(|r| from_row(&r))
                .collect::<Result<Vec<_>, pgrx::spi::SpiError>>()
        }),
    )
}

/// The key columns of the tables protected for `entity_type` on this shard.
pub fn columns_of(entity_type: &str) -> Vec<KeyColumn> {
    protected_columns("p.entity_type = $1", entity_type.into())
}

/// Column `column` of table `relid`, as a key column; `None` when the table has no such column.
pub fn column(relid: pg_sys::Oid, column: &str) -> Option<KeyColumn> {
    spi(
        "look up the key column",
        Spi::connect(|c| {
            c.select(
                "SELECT format('%s.%I', attrelid::regclass, attname), atttypid, atttypmod, attcollation \
                 FROM pg_catalog.pg_attribute \
                 WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                Some(1),
                &[relid.into(), column.into()],
            )?
            .map(|r| from_row(&r))
            .next()
            .transpose()
        }),
    )
}

/// Refuses `entity_id` unless it is canonical for every key column in `columns`.
pub fn require_canonical(entity_type: &str, entity_id: &str, columns: &[KeyColumn]) {
    for column in columns {
        let canonical = canonical(column, require_form(column), entity_id);
        if canonical != entity_id {
            SdError::NonCanonicalId {
                entity: crate::entity::EntityKey {
                    entity_type: entity_type.to_owned(),
                    entity_id: entity_id.to_owned(),
                },
                column: column.name.clone(),
                type_name: type_name(column.typoid, column.typmod),
                canonical,
            }
            .raise();
        }
    }
}

/// The canonical text of `entity_id` as a key of `tbl` (protected with a key column): what the
/// mover compares the directory's id with before it moves anything. Refuses a table that is not
/// protected with a key column, or whose key type cannot key an entity.
#[pg_extern(stable, parallel_safe)]
fn canonical_entity_id(tbl: pgrx::PgRelation, entity_id: Option<&str>) -> String {
    let entity_id = crate::error::required(entity_id, "entity_id");
    let Some(column) = protected_columns("p.tbl = $1", tbl.oid().into()).pop() else {
        SdError::NotProtectedWithKey {
            table: crate::catalog::relation_name(tbl.oid()),
        }
        .raise()
    };
    canonical(&column, require_form(&column), entity_id)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn char_n_keys_are_read_without_their_padding() {
        assert_eq!(Form::Unpadded.text(b"acme    "), b"acme");
        assert_eq!(Form::Unpadded.text(b"    "), b"");
        assert_eq!(Form::Unpadded.text(b" a b "), b" a b");
        assert_eq!(Form::Exact.text(b"acme  "), b"acme  ");
    }

    #[test]
    fn the_numeric_scale_comes_from_the_type_modifier() {
        let typmod = |precision: i32, scale: i32| ((precision << 16) | (scale & 0x7ff)) + 4;
        assert_eq!(numeric_scale(typmod(10, 0)), Some(0));
        assert_eq!(numeric_scale(typmod(10, 2)), Some(2));
        assert_eq!(numeric_scale(typmod(10, -3)), Some(-3));
        assert_eq!(numeric_scale(-1), None);
    }
}
