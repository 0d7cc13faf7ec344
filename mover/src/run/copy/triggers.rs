//! The target's own triggers, and the rows the mover's copy writes there. Those rows were
//! processed on their source already (a counter counted them, an audit row was written, a BEFORE
//! trigger shaped them): through the target's triggers again they would be counted twice, or
//! altered so that they no longer match the source's, and a trigger that reads an unqualified
//! name fails under the mover's pinned `search_path`. Logical apply runs as
//! `session_replication_role = replica`, where only triggers enabled ALWAYS or REPLICA fire; the
//! mover's copy (`copy`) runs so too whenever a trigger on the entity's tables would fire
//! otherwise. Replica skips the foreign keys' triggers as well, so what the copied rows
//! reference is then checked before the cutover, as after logical apply (`integrity`).
//!
//! Setting it takes a superuser or, from PostgreSQL 15, `GRANT SET ON PARAMETER
//! session_replication_role`: preflight refuses a role without it, naming the triggers.

use tokio_postgres::Client;

use crate::error::{At, Error, Step};
use crate::preflight::privileges;
use crate::shards::catalog::EntityTable;

/// User triggers on INSERT or DELETE (what the copy runs) of the tables and their partitions that
/// fire on origin or on replica only, so that `session_replication_role` decides whether they
/// fire; not the extension's own (they check nothing for the mover, which bypasses the fence),
/// nor the foreign keys' (internal).
const DEPENDING_ON_ROLE: &str = "
SELECT DISTINCT format('trigger %s on %s.%s', quote_ident(g.tgname), n.nspname, c.relname)
  FROM unnest($1::text[]) AS e(t)
  CROSS JOIN LATERAL (SELECT to_regclass(e.t) AS relid
                      UNION SELECT relid FROM pg_partition_tree(to_regclass(e.t))) tree
  JOIN pg_trigger g ON g.tgrelid = tree.relid
  JOIN pg_class c ON c.oid = g.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = g.tgfoid
 WHERE NOT g.tgisinternal AND g.tgenabled IN ('O', 'R')
   AND g.tgtype::int & 12 <> 0
   AND p.pronamespace <> 'shard_directory'::regnamespace
 ORDER BY 1";

/// Whether the mover's copy into `tables` on `shard` runs as `session_replication_role =
/// replica`: when a trigger there would otherwise fire for the copied rows. Refuses, naming the
/// triggers and the GRANTs, when the mover's role may not set it, or may not read the tables the
/// copied rows reference (checked then by the mover, as no foreign key is).
pub(crate) async fn copy_as_replica(
    client: &Client,
    shard: &str,
    tables: &[EntityTable],
    step: Step,
) -> Result<bool, Error> {
    let quoted: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
    let triggers: Vec<String> = client
        .query(DEPENDING_ON_ROLE, &[&quoted])
        .await
        .at(step, shard)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if triggers.is_empty() {
        return Ok(false);
    }
    let mut missing: Vec<String> = client
        .query(
            "SELECT format('GRANT SET ON PARAMETER session_replication_role TO %I', current_user) \
             WHERE NOT has_parameter_privilege('session_replication_role', 'SET')",
            &[],
        )
        .await
        .at(step, shard)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    missing.extend(
        privileges::missing_for_references(client, tables)
            .await
            .at(step, shard)?,
    );
    if missing.is_empty() {
        return Ok(true);
    }
    Err(Error::Preflight {
        problem: format!(
            "target shard {shard} has {}, which a copy must not fire for rows their source \
             processed already: the copy runs with session_replication_role = replica for it, \
             as logical apply does (foreign keys unchecked: the mover checks what the rows \
             reference itself), and the mover's role lacks what that needs",
            triggers.join(", ")
        ),
        fix: format!(
            "{} on shard {shard} (or make the mover's role a superuser there)",
            missing.join("; ")
        ),
    })
}

/// For the mover's deletes (the target's rows on an abort, the source's after the cutover): the
/// rows are leaving, not being deleted by the application, so they go as replica wherever the
/// mover's role may set it and a trigger would fire; where it may not, the triggers fire (as
/// mover/README.md says).
pub(crate) async fn delete_as_replica(
    client: &Client,
    shard: &str,
    tables: &[EntityTable],
    step: Step,
) -> bool {
    copy_as_replica(client, shard, tables, step)
        .await
        .unwrap_or(false)
}
