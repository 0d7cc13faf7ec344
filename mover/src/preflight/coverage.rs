//! Which tables hold an entity's rows: all of them must be protected, or a move would leave rows
//! behind on the source, or lose them when the source's rows are deleted (a foreign key with
//! `ON DELETE CASCADE` from a table nobody protected takes its rows along, one with `NO ACTION`
//! stops the delete halfway). Preflight refuses, naming the table, when a table that is not
//! protected for the entity type references one that is, or, protected for no type, holds a
//! column named like a key column of one (unless the operator says its rows are not the
//! entity's). It also refuses an inheritance child of a protected table: the shard checks its
//! rows, but the mover moves tables one by one and would copy the child's rows through its
//! parent, without the child's own columns.

use tokio_postgres::Client;

use crate::error::{At, Error, Step};

/// Tables that are not protected for `$1` but reference one that is (through any partition), and
/// what they reference.
const REFERENCING: &str = "
WITH protected AS (SELECT tbl::oid AS oid FROM shard_directory.protected_tables()
                    WHERE entity_type = $1)
SELECT DISTINCT format('%s.%s', n.nspname, c.relname), f.conname,
       format('%s.%s', rn.nspname, r.relname)
  FROM pg_constraint f
  JOIN pg_class c ON c.oid = coalesce(pg_partition_root(f.conrelid), f.conrelid)
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_class r ON r.oid = coalesce(pg_partition_root(f.confrelid), f.confrelid)
  JOIN pg_namespace rn ON rn.oid = r.relnamespace
 WHERE f.contype = 'f' AND f.conparentid = 0
   AND r.oid IN (SELECT oid FROM protected) AND c.oid NOT IN (SELECT oid FROM protected)
 ORDER BY 1, 2";

/// The first inheritance child (not a partition), at any depth, of a table protected for `$1`,
/// with its parent.
const INHERITING: &str = "
WITH RECURSIVE tree (child, parent) AS (
    SELECT i.inhrelid, i.inhparent FROM pg_inherits i
     WHERE i.inhparent IN (SELECT tbl FROM shard_directory.protected_tables()
                            WHERE entity_type = $1)
    UNION
    SELECT i.inhrelid, i.inhparent FROM pg_inherits i JOIN tree ON i.inhparent = tree.child)
SELECT format('%s.%s', n.nspname, c.relname), t.parent::regclass::text
  FROM tree t
  JOIN pg_class c ON c.oid = t.child
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT c.relispartition
 ORDER BY 1
 LIMIT 1";

/// Tables (not partitions, not the system's or the extension's) that are protected for no entity
/// type and have a column named like the key column of a table protected for `$1`.
const HOLDING_KEY: &str = "
WITH protected AS (SELECT tbl::oid AS oid, key_column FROM shard_directory.protected_tables()
                    WHERE entity_type = $1)
SELECT format('%s.%s', n.nspname, c.relname), a.attname::text
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence <> 't'
   AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'shard_directory')
   AND n.nspname !~ '^pg_toast'
   AND a.attname IN (SELECT key_column FROM protected)
   AND c.oid NOT IN (SELECT tbl FROM shard_directory.protected_tables())
 ORDER BY 1";

/// Refuses when a table on `shard` that is not protected for the entity type may hold the
/// entity's rows. `unrelated` names tables (`schema.table`) whose column of the key's name is
/// known not to hold the entity's id.
pub(crate) async fn check(
    client: &Client,
    shard: &str,
    entity_type: &str,
    unrelated: &[String],
) -> Result<(), Error> {
    let protect = |table: &str| {
        format!(
            "SELECT shard_directory.protect('{table}', '<its key column>', '{entity_type}') on \
             every shard"
        )
    };
    let inheriting = client.query(INHERITING, &[&entity_type]).await;
    if let Some(r) = inheriting.at(Step::Preflight, shard)?.first() {
        let (child, parent): (String, String) = (r.get(0), r.get(1));
        return Err(Error::Preflight {
            problem: format!(
                "table {child} on shard {shard} inherits {parent}, which is protected for \
                 entity type '{entity_type}': the mover does not move an inheritance child's \
                 rows (copied through {parent}, they would lose {child}'s own columns)"
            ),
            fix: format!(
                "make {parent} a partitioned table and {child} a partition of it (partitions \
                 move), or move {child}'s rows into {parent}; the shard checks a child's rows \
                 either way"
            ),
        });
    }
    let referencing = client.query(REFERENCING, &[&entity_type]).await;
    if let Some(r) = referencing.at(Step::Preflight, shard)?.first() {
        let (table, constraint, referenced): (String, String, String) =
            (r.get(0), r.get(1), r.get(2));
        return Err(Error::Preflight {
            problem: format!(
                "table {table} on shard {shard} references {referenced} (foreign key \
                 {constraint}), which is protected for entity type '{entity_type}', but is not \
                 protected itself: its rows would not move, and deleting the entity's rows from \
                 the source would cascade to them or be refused"
            ),
            fix: format!(
                "{}; or drop the foreign key if its rows are not the entity's",
                protect(&table)
            ),
        });
    }
    let holding = client.query(HOLDING_KEY, &[&entity_type]).await;
    for r in holding.at(Step::Preflight, shard)? {
        let (table, column): (String, String) = (r.get(0), r.get(1));
        if unrelated.contains(&table) {
            continue;
        }
        return Err(Error::Preflight {
            problem: format!(
                "table {table} on shard {shard} has a column {column}, like the key column of \
                 the tables protected for entity type '{entity_type}', but is not protected: \
                 its rows of the entity would stay behind on the source"
            ),
            fix: format!(
                "{}; or, if its {column} does not hold entity ids, name it as unrelated \
                 (--unrelated-table {table})",
                protect(&table)
            ),
        });
    }
    Ok(())
}
