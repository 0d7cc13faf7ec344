//! `protect` / `unprotect`: native enforcement triggers on application tables, so every write is
//! checked without the application calling anything.
//!
//! The trigger functions are not executable by PUBLIC, so `protect` creates the triggers as the
//! owner of the extension's tables, after checking that the caller holds TRIGGER on the table
//! (what `CREATE TRIGGER` itself asks). The statement trigger (which also refuses TRUNCATE) is
//! installed on the table and each partition or inheritance child, the row trigger on each table
//! that holds rows; partitions and children made or attached later get both from an event
//! trigger, however they are made (inside `CREATE SCHEMA`, in a session replaying as a replica). A key column's type must be
//! one that can key an entity (`key`).

use pgrx::prelude::*;
use pgrx::PgRelation;

use super::cached;
use super::check::{ROW_TRIGGER, STATEMENT_TRIGGER};
use super::key;
use crate::error::{required, spi, SdError};
use crate::{catalog, privilege};

/// The table and every table under it, parents first: its partitions and its inheritance
/// children (`pg_inherits` lists both), at any depth. An `UPDATE` or `DELETE` of the table
/// reaches their rows, and only their own row triggers see them.
const TREE: &str = "WITH RECURSIVE tree (relid, level) AS ( \
                        SELECT $1::regclass::oid, 0 \
                        UNION SELECT i.inhrelid, tree.level + 1 \
                        FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.relid) \
                    SELECT array_agg(relid::regclass ORDER BY level) \
                    FROM (SELECT relid, min(level) AS level FROM tree GROUP BY relid) t";

fn run_generated(generator: &str, args: &[pgrx::datum::DatumWithOid]) {
    spi(
        "protect DDL",
        Spi::connect_mut(|c| {
            let ddl = c
                .select(generator, Some(1), args)?
                .first()
                .get_one::<String>()?
                .unwrap_or_default();
            if ddl.is_empty() {
                return Ok(());
            }
            c.update(ddl.as_str(), None, &[]).map(|_| ())
        }),
    );
}

/// Checks the caller may put triggers on `table`, then runs `f` as the extension's owner.
fn as_protector(table: &PgRelation, f: impl FnOnce(pg_sys::Oid)) {
    let oid = table.oid();
    let role = privilege::current_role();
    if !privilege::has_table_privilege(oid, role, pg_sys::ACL_TRIGGER) {
        SdError::ProtectNotAllowed {
            table: catalog::relation_name(oid),
            role: privilege::role_name(role),
        }
        .raise();
    }
    let kind = unsafe { (*table.rd_rel).relkind } as u8;
    if kind != pg_sys::RELKIND_RELATION && kind != pg_sys::RELKIND_PARTITIONED_TABLE {
        SdError::NotATable {
            table: catalog::relation_name(oid),
        }
        .raise();
    }
    privilege::as_owner_of(cached::tables().settings, || f(oid));
    // Every backend's cache of the fences holds the key columns of each fenced type.
    cached::protection_changed();
}

/// Drops the triggers `protect` made on the table and the tables under it (not clones, which go
/// with their parent's), so `protect` twice and `unprotect` say nothing.
fn drop_triggers(oid: pg_sys::Oid) {
    run_generated(
        &format!(
            "SELECT coalesce(string_agg(format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass), '; '), '') \
             FROM pg_catalog.pg_trigger t WHERE t.tgrelid = ANY (({TREE})::oid[]) AND t.tgparentid = 0 \
             AND t.tgname IN ($2, $3)"
        ),
        &[
            oid.into(),
            STATEMENT_TRIGGER.to_str().unwrap_or_default().into(),
            ROW_TRIGGER.to_str().unwrap_or_default().into(),
        ],
    );
}

/// A trigger's arguments (`$3`), quoted for `CREATE TRIGGER`.
const ARGS: &str =
    "(SELECT coalesce(string_agg(quote_literal(a), ', '), '') FROM unnest($3::text[]) a)";

fn install(oid: pg_sys::Oid, rows: Option<(&str, &str)>) {
    drop_triggers(oid);
    if let Some((key_column, _)) = rows {
        match key::column(oid, key_column) {
            Some(column) => {
                key::require_form(&column);
            }
            None => SdError::UnknownColumn {
                table: catalog::relation_name(oid),
                column: key_column.to_owned(),
            }
            .raise(),
        }
    }
    let args: Vec<&str> = rows.map_or_else(Vec::new, |(key_column, entity_type)| {
        vec![key_column, entity_type]
    });
    // On the table and each table under it; the table's carries the key, where `protected_tables()`
    // and the event trigger that protects new partitions read it.
    run_generated(
        &format!(
            "SELECT string_agg(format('CREATE TRIGGER %I \
             BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT \
             EXECUTE FUNCTION shard_directory.shard_directory_protect_statement(%s)', $2, p, \
             CASE WHEN p = $1::regclass THEN {ARGS} ELSE '' END), '; ') \
             FROM unnest(({TREE})::regclass[]) p"
        ),
        &[
            oid.into(),
            STATEMENT_TRIGGER.to_str().unwrap_or_default().into(),
            args.clone().into(),
        ],
    );
    let partitioned = spi(
        "look up the table's kind",
        Spi::get_one_with_args::<bool>(
            "SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = $1",
            &[oid.into()],
        ),
    )
    .unwrap_or(false);
    // On each table that holds rows, its own: a partitioned table's row trigger would be cloned
    // onto its partitions, and a parallel pg_restore, which holds a table's triggers back only
    // until its own rows are in, could then create it while a partition's rows load. With the
    // key; without one under a partitioned table, for the shard-wide rule on writes made straight
    // to a partition (the statement trigger does not reach them).
    if rows.is_some() || partitioned {
        run_generated(
            &format!(
                "SELECT string_agg(format('CREATE TRIGGER %I \
                 AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW \
                 EXECUTE FUNCTION shard_directory.shard_directory_protect_row(%s)', $2, p, {ARGS}), '; ') \
                 FROM unnest(({TREE})::regclass[]) p \
                 WHERE (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = p) = 'r'"
            ),
            &[
                oid.into(),
                ROW_TRIGGER.to_str().unwrap_or_default().into(),
                args.into(),
            ],
        );
    }
    check_inherited_keys();
}

/// The first table under tables protected with different keys (a child of two by inheritance,
/// or one protected itself under a parent protected otherwise), with those protections.
const DIFFERENT_KEYS: &str = "\
    WITH RECURSIVE p AS (SELECT tbl::oid AS root, key_column, entity_type \
                           FROM shard_directory.protected_tables()), \
    tree (root, relid) AS ( \
        SELECT root, root FROM p \
        UNION SELECT tree.root, i.inhrelid \
        FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.relid) \
    SELECT tree.relid::regclass::text, \
           string_agg(format('%s (%s by %s)', tree.root::regclass, p.entity_type, p.key_column), \
                      ', ' ORDER BY tree.root::regclass::text) \
      FROM tree JOIN p USING (root) \
     GROUP BY tree.relid \
    HAVING count(DISTINCT (p.key_column, p.entity_type)) > 1 \
     ORDER BY 1 LIMIT 1";

/// Refuses a table under tables protected with different keys: its one row trigger would check
/// its rows for one of them, and the other's fences would not reach it. Run by `protect` and by
/// the event trigger as tables are made or attached (`INHERITS`, `ALTER TABLE ... INHERIT`).
/// Under the SQL of 0.1.0 (this library, the extension not updated yet) there is nothing to read.
#[pg_extern(volatile)]
fn check_inherited_keys() {
    let found = spi(
        "read the protected tables",
        Spi::connect(|c| {
            let listed = c.select(
                "SELECT 1 WHERE to_regprocedure('shard_directory.protected_tables()') IS NOT NULL",
                Some(1),
                &[],
            )?;
            if listed.is_empty() {
                return Ok(None);
            }
            let rows = c.select(DIFFERENT_KEYS, Some(1), &[])?;
            if rows.is_empty() {
                return Ok::<_, pgrx::spi::SpiError>(None);
            }
            rows.first().get_two::<String, String>().map(Some)
        }),
    );
    if let Some((Some(table), Some(protections))) = found {
        SdError::DifferentKeys { table, protections }.raise()
    }
}

/// Checks every INSERT, UPDATE, DELETE and TRUNCATE of `tbl` against the client's directory
/// version (and its declared entity). Protecting twice is harmless.
#[pg_extern(volatile, name = "protect")]
fn protect(tbl: PgRelation) {
    as_protector(&tbl, |oid| install(oid, None));
}

/// As `protect(tbl)`, and each row's `key_column` is checked as an entity of `entity_type`
/// against its fence, so a statement touching a moved tenant's row is refused whole.
#[pg_extern(volatile, name = "protect")]
fn protect_rows(tbl: PgRelation, key_column: Option<&str>, entity_type: Option<&str>) {
    let key_column = required(key_column, "key_column");
    let entity_type = required(entity_type, "entity_type");
    as_protector(&tbl, |oid| install(oid, Some((key_column, entity_type))));
}

/// Removes what `protect` installed on `tbl`, its partitions and its inheritance children.
#[pg_extern(volatile)]
fn unprotect(tbl: PgRelation) {
    as_protector(&tbl, drop_triggers);
}
