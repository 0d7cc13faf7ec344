//! SPI plans prepared once per backend and kept (`SPI_keepplan`). The directory's write path
//! runs the same few statements for every changed row; parsing and planning them each time was
//! most of its cost (a `perf` profile of `bash scripts/bench.sh directory`).
//!
//! Every statement names its objects with their schema, and is prepared and executed inside
//! `privilege::as_owner_of`, which pins `search_path = pg_catalog, pg_temp`: at every execution,
//! not only the first, because PostgreSQL's plan cache re-analyzes a kept plan whenever the
//! current `search_path` differs from the one it was prepared with (and after DDL on its tables).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::pg_sys::{PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};

thread_local! {
    static KEPT: RefCell<HashMap<&'static str, Rc<OwnedPreparedStatement>>> = RefCell::default();
}

/// A statement of the extension: its text and its parameters' types.
pub struct Plan {
    pub sql: &'static str,
    pub args: &'static [PgBuiltInOids],
    /// Writes: executed read-write.
    pub mutating: bool,
}

impl Plan {
    /// The kept plan, prepared on first use in this backend.
    pub fn kept(&'static self, client: &SpiClient<'_>) -> SpiResult<Rc<OwnedPreparedStatement>> {
        if let Some(plan) = KEPT.with_borrow(|kept| kept.get(self.sql).cloned()) {
            return Ok(plan);
        }
        let args: Vec<PgOid> = self.args.iter().map(|&oid| PgOid::BuiltIn(oid)).collect();
        let prepared = if self.mutating {
            client.prepare_mut(self.sql, &args)?
        } else {
            client.prepare(self.sql, &args)?
        };
        let plan = Rc::new(prepared.keep());
        KEPT.with_borrow_mut(|kept| kept.insert(self.sql, plan.clone()));
        Ok(plan)
    }
}
