//! `protect` / `unprotect`: native enforcement triggers on application tables, so every write is
//! checked without the application calling anything.

use pgrx::prelude::*;
use pgrx::PgRelation;

use crate::error::{required, SdError};

/// Drops only the triggers that exist, so `protect` twice and `unprotect` say nothing.
const DROP: &str =
    "SELECT coalesce(string_agg(format('DROP TRIGGER %I ON %s', tgname, $1::regclass), '; '), '') \
                    FROM pg_catalog.pg_trigger WHERE tgrelid = $1 \
                    AND tgname IN ('shard_directory_protect', 'shard_directory_protect_row')";

fn run_generated(generator: &str, args: &[pgrx::datum::DatumWithOid]) {
    Spi::connect_mut(|c| {
        let ddl = c
            .select(generator, Some(1), args)?
            .first()
            .get_one::<String>()?
            .expect("generated DDL");
        c.update(ddl.as_str(), None, &[]).map(|_| ())
    })
    .expect("protect DDL");
}

fn install(table: PgRelation, rows: Option<(&str, &str)>) {
    let oid = table.oid();
    run_generated(DROP, &[oid.into()]);
    run_generated(
        "SELECT format('CREATE TRIGGER shard_directory_protect \
         BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s \
         FOR EACH STATEMENT EXECUTE FUNCTION shard_directory.shard_directory_protect_statement()', $1::regclass)",
        &[oid.into()],
    );
    if let Some((key_column, entity_type)) = rows {
        let exists = Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped)",
            &[oid.into(), key_column.into()],
        )
        .expect("look up key column")
        .unwrap_or(false);
        if !exists {
            let table =
                Spi::get_one_with_args::<String>("SELECT $1::regclass::text", &[oid.into()])
                    .expect("table name")
                    .unwrap_or_default();
            SdError::UnknownColumn {
                table,
                column: key_column.to_owned(),
            }
            .raise();
        }
        run_generated(
            "SELECT format('CREATE TRIGGER shard_directory_protect_row \
             BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW \
             EXECUTE FUNCTION shard_directory.shard_directory_protect_row(%L, %L)', $1::regclass, $2, $3)",
            &[oid.into(), key_column.into(), entity_type.into()],
        );
    }
}

/// Checks every INSERT, UPDATE, DELETE and TRUNCATE of `tbl` against the client's directory
/// version (and its declared entity). Protecting twice is harmless.
#[pg_extern(volatile, name = "protect")]
fn protect(tbl: PgRelation) {
    install(tbl, None);
}

/// As `protect(tbl)`, and each row's `key_column` is checked as an entity of `entity_type`
/// against its fence, so a statement touching a moved tenant's row is refused whole.
#[pg_extern(volatile, name = "protect")]
fn protect_rows(tbl: PgRelation, key_column: Option<&str>, entity_type: Option<&str>) {
    let key_column = required(key_column, "key_column");
    let entity_type = required(entity_type, "entity_type");
    install(tbl, Some((key_column, entity_type)));
}

/// Removes what `protect` installed on `tbl`.
#[pg_extern(volatile)]
fn unprotect(tbl: PgRelation) {
    run_generated(DROP, &[tbl.oid().into()]);
}
