//! A steady application workload routed through client instances, and the audit that says where
//! every order it wrote ended up. The demo, the proof and the outage drills share both, so that
//! "no acknowledged write was lost" means the same thing in each.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use shard_directory_client::{EntityKey, Error, Router};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Topology;

/// What the application was told about each order it wrote.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// item -> tenant, for every order whose transaction committed (and every seeded one).
    pub acked: HashMap<String, String>,
    /// item -> tenant, for every order whose transaction returned an error: it may or may not
    /// have committed (an error at COMMIT cannot say).
    pub unacked: HashMap<String, String>,
    /// Failed writes by (tenant, error kind).
    pub failed: BTreeMap<(String, String), u64>,
    /// The first error of each kind, as the application saw it.
    pub first_error: BTreeMap<String, String>,
    /// Errors that `is_retryable` says the application should not retry.
    pub fatal: Vec<String>,
    /// Routed reads (one after each write): done, and failed by (tenant, error kind).
    pub reads: u64,
    pub failed_reads: BTreeMap<(String, String), u64>,
}

impl Ledger {
    /// Writes attempted: acknowledged or not (seeded orders are not attempts).
    pub fn attempted(&self, seeded: usize) -> usize {
        self.acked.len() - seeded + self.unacked.len()
    }

    fn record(
        &mut self,
        tenant: &str,
        item: String,
        wrote: Result<(), Error>,
        read: Result<i64, Error>,
    ) {
        match wrote {
            Ok(()) => {
                self.acked.insert(item, tenant.to_owned());
            }
            Err(e) => {
                if !e.is_retryable() {
                    self.fatal.push(format!("{tenant}: {e:?}"));
                }
                let kind = kind(&e);
                self.first_error
                    .entry(kind.clone())
                    .or_insert_with(|| format!("tenant {tenant}: {e}"));
                *self.failed.entry((tenant.to_owned(), kind)).or_default() += 1;
                self.unacked.insert(item, tenant.to_owned());
            }
        }
        match read {
            Ok(_) => self.reads += 1,
            Err(e) => {
                *self
                    .failed_reads
                    .entry((tenant.to_owned(), kind(&e)))
                    .or_default() += 1
            }
        }
    }

    /// Failed writes and reads of `tenant`.
    pub fn failures_of(&self, tenant: &str) -> u64 {
        self.failed
            .iter()
            .chain(&self.failed_reads)
            .filter(|((t, _), _)| t == tenant)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The variant's name: "FailClosed", "ShardConnection", ...
fn kind(e: &Error) -> String {
    format!("{e:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// What a workload writes for an entity, and how the audit finds it again: by default the
/// orders of the harness's schema ([`Orders`]); the wider proof has others.
pub trait Writes: Send + Sync {
    /// The entity type the written rows belong to.
    fn entity_type(&self) -> &'static str;
    /// One write of `item` for entity `id`, in one routed transaction.
    fn write<'a>(
        &'a self,
        router: &'a Router,
        id: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// A routed read of entity `id` (its items, counted).
    fn count<'a>(&'a self, router: &'a Router, id: &'a str) -> BoxFuture<'a, Result<i64, Error>>;
    /// A query listing, on one shard, every written item: `(entity id as text, item, parts)`,
    /// where `parts` counts the rows written with the item in other tables (0 means one is
    /// missing).
    fn audit_sql(&self) -> &'static str;
}

/// An order with its line, in the harness's `orders` and `order_lines`.
pub struct Orders;

impl Writes for Orders {
    fn entity_type(&self) -> &'static str {
        "tenant"
    }

    fn write<'a>(
        &'a self,
        router: &'a Router,
        id: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(write_order(router, id, item))
    }

    fn count<'a>(&'a self, router: &'a Router, id: &'a str) -> BoxFuture<'a, Result<i64, Error>> {
        Box::pin(count_orders(router, id))
    }

    fn audit_sql(&self) -> &'static str {
        "SELECT o.tenant_id, o.item, count(l.*) FROM orders o
         LEFT JOIN order_lines l USING (tenant_id, order_id) GROUP BY 1, 2"
    }
}

/// One order and its line for `tenant`, in one routed transaction.
pub async fn write_order(router: &Router, tenant: &str, item: &str) -> Result<(), Error> {
    let (tenant, item) = (tenant.to_owned(), item.to_owned());
    router
        .run(
            &EntityKey::new("tenant", tenant.clone()),
            async move |tx| {
                let order: i64 = tx
                    .query_one(
                        "INSERT INTO orders (tenant_id, item) VALUES ($1, $2) RETURNING order_id",
                        &[&tenant, &item],
                    )
                    .await?
                    .get(0);
                tx.execute(
                    "INSERT INTO order_lines (tenant_id, order_id, line_no, product) VALUES ($1, $2, 1, $3)",
                    &[&tenant, &order, &item],
                )
                .await?;
                Ok(())
            },
        )
        .await
}

/// The tenant's orders, read (checked) where the directory says they are: on the source while
/// it owns them, though both shards are read mid-move.
pub async fn count_orders(router: &Router, tenant: &str) -> Result<i64, Error> {
    let t = tenant.to_owned();
    router
        .read(&EntityKey::new("tenant", tenant), async move |tx| {
            Ok(tx
                .query_one("SELECT count(*) FROM orders WHERE tenant_id = $1", &[&t])
                .await?
                .get::<_, i64>(0))
        })
        .await
        .map(|reads| reads.merge(|source, _| source))
}

/// The shards' refusals the routers counted (and retried, unless out of time), by reason.
pub fn refusals(routers: &[Arc<Router>]) -> BTreeMap<String, u64> {
    let mut by_reason = BTreeMap::new();
    for r in routers {
        for (reason, n) in r.directory().stats().rejections {
            *by_reason.entry(reason).or_default() += n;
        }
    }
    by_reason
}

/// Writers that run until [`Workload::stop`].
pub struct Workload {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    ledger: Arc<Mutex<Ledger>>,
}

impl Workload {
    /// `writers` tasks per router. Each writes an order with its line for a tenant of `tenants`
    /// taken at random, reads that tenant's order count, and pauses `pause`. Items are unique
    /// (`w<writer>-<n>`). `ledger` starts with what was there before (the seeded orders).
    pub fn start(
        routers: &[Arc<Router>],
        tenants: &[&str],
        writers: usize,
        pause: Duration,
        seed: u64,
        ledger: Ledger,
    ) -> Workload {
        Workload::start_with(
            Arc::new(Orders),
            routers,
            tenants,
            writers,
            pause,
            seed,
            ledger,
        )
    }

    /// [`Workload::start`], writing what `writes` writes.
    pub fn start_with(
        writes: Arc<dyn Writes>,
        routers: &[Arc<Router>],
        tenants: &[&str],
        writers: usize,
        pause: Duration,
        seed: u64,
        ledger: Ledger,
    ) -> Workload {
        let (stop, stopped) = watch::channel(false);
        let ledger = Arc::new(Mutex::new(ledger));
        let seq = Arc::new(AtomicU64::new(0));
        let tenants: Arc<[String]> = tenants.iter().map(|t| t.to_string()).collect();
        let mut tasks = Vec::new();
        for w in 0..routers.len() * writers {
            let router = routers[w % routers.len()].clone();
            let (ledger, seq, tenants) = (ledger.clone(), seq.clone(), tenants.clone());
            let writes = writes.clone();
            let mut stopped = stopped.clone();
            let mut rng = fastrand::Rng::with_seed(seed ^ (w as u64 + 1));
            tasks.push(tokio::spawn(async move {
                while !*stopped.borrow() {
                    let tenant = &tenants[rng.usize(..tenants.len())];
                    let item = format!("w{w}-{}", seq.fetch_add(1, Ordering::Relaxed));
                    let wrote = writes.write(&router, tenant, &item).await;
                    let read = writes.count(&router, tenant).await;
                    ledger.lock().unwrap().record(tenant, item, wrote, read);
                    // Also wakes when told to stop, so that stopping never waits out a pause.
                    let _ = tokio::time::timeout(pause, stopped.changed()).await;
                }
            }));
        }
        Workload {
            stop,
            tasks,
            ledger,
        }
    }

    /// The ledger so far.
    pub fn ledger(&self) -> Ledger {
        self.ledger.lock().unwrap().clone()
    }

    /// Stops the writers (each finishes the transaction it is in) and returns the ledger.
    pub async fn stop(self) -> Ledger {
        self.stop.send(true).unwrap();
        for task in self.tasks {
            task.await.expect("a writer panicked");
        }
        Arc::try_unwrap(self.ledger)
            .expect("the writers are done")
            .into_inner()
            .unwrap()
    }
}

/// Where every order is, against what the ledger says.
#[derive(Debug, Default)]
pub struct Audit {
    /// (tenant, shard) -> (orders, order lines).
    pub rows: BTreeMap<(String, String), (i64, i64)>,
    /// Acknowledged orders found nowhere.
    pub lost: Vec<String>,
    /// Orders found more than once.
    pub duplicated: Vec<String>,
    /// Orders on a shard the directory does not name for their tenant.
    pub misplaced: Vec<String>,
    /// Orders nobody wrote.
    pub unknown: Vec<String>,
    /// Orders without their line.
    pub without_line: Vec<String>,
    /// Unacknowledged orders that committed all the same (an error at COMMIT).
    pub unacked_landed: usize,
}

impl Audit {
    /// Reads every shard. The directory must be reachable and no move open.
    pub async fn of(t: &Topology, ledger: &Ledger) -> Audit {
        Audit::of_with(t, ledger, &Orders).await
    }

    /// [`Audit::of`] for what `writes` wrote.
    pub async fn of_with(t: &Topology, ledger: &Ledger, writes: &dyn Writes) -> Audit {
        let placements: HashMap<String, String> = t
            .dba()
            .await
            .query(
                "SELECT entity_id, shard_name FROM shard_directory.shard_directory WHERE entity_type = $1",
                &[&writes.entity_type()],
            )
            .await
            .expect("read the placements")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut audit = Audit::default();
        let mut seen: HashMap<String, Vec<String>> = HashMap::new();
        for (shard, _) in &t.shards {
            let c = t.shard(shard).await;
            for r in c
                .query(writes.audit_sql(), &[])
                .await
                .expect("read the orders")
            {
                let (tenant, item, lines): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
                let counts = audit
                    .rows
                    .entry((tenant.clone(), shard.clone()))
                    .or_default();
                counts.0 += 1;
                counts.1 += lines;
                if lines == 0 {
                    audit
                        .without_line
                        .push(format!("{item} of {tenant} on {shard}"));
                }
                if placements.get(&tenant) != Some(shard) {
                    audit
                        .misplaced
                        .push(format!("{item} of {tenant} on {shard}"));
                }
                seen.entry(item).or_default().push(shard.clone());
            }
        }
        audit.lost = ledger
            .acked
            .keys()
            .filter(|i| !seen.contains_key(*i))
            .cloned()
            .collect();
        audit.duplicated = seen
            .iter()
            .filter(|(_, at)| at.len() > 1)
            .map(|(i, at)| format!("{i}: {at:?}"))
            .collect();
        audit.unknown = seen
            .keys()
            .filter(|i| !ledger.acked.contains_key(*i) && !ledger.unacked.contains_key(*i))
            .cloned()
            .collect();
        audit.unacked_landed = ledger
            .unacked
            .keys()
            .filter(|i| seen.contains_key(*i))
            .count();
        audit
    }

    /// Whether every acknowledged order is stored once, where the directory says, with its
    /// line, and nothing else is stored.
    pub fn holds(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.misplaced.is_empty()
            && self.unknown.is_empty()
            && self.without_line.is_empty()
    }

    /// `(orders, lines)` of `tenant` on `shard`.
    pub fn rows_of(&self, tenant: &str, shard: &str) -> (i64, i64) {
        self.rows
            .get(&(tenant.to_owned(), shard.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// What went wrong, at most 20 of each.
    pub fn problems(&self) -> String {
        let few = |v: &[String]| v.iter().take(20).cloned().collect::<Vec<_>>();
        format!(
            "lost {:?}; duplicated {:?}; misplaced {:?}; unknown {:?}; without their line {:?}",
            few(&self.lost),
            few(&self.duplicated),
            few(&self.misplaced),
            few(&self.unknown),
            few(&self.without_line)
        )
    }
}
