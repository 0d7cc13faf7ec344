//! The conformance suite: what any `shard_directory` client must do (docs/protocol.md), as
//! scenarios written once as data (`scenarios/`), run against a client through a small driver
//! that speaks JSON lines (README.md), on throwaway clusters from the end-to-end suite's harness.
//! `shard-directory-conformance --driver CMD` runs them; the Rust client's driver is
//! `shard-directory-conformance-rust`. `--fleet N` (`fleet`) lends the same clusters to a
//! client's own tests.

pub mod driver;
pub mod fleet;
pub mod run;
pub mod scenario;

pub use run::{run, Failure};
pub use scenario::{load, shipped, Scenario};
