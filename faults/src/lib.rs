//! lockline's randomized fault test (DESIGN §7), in the manner of Jepsen.
//!
//! A run starts a 3-member etcd cluster or ZooKeeper ensemble, or one
//! PostgreSQL or MariaDB server (with a standby or replica to fail over to),
//! or one Redis server (with an append-only file fsynced
//! on every write, or without persistence), on loopback, a fenced register and history server in
//! this process, and N contender *processes* (this crate's binary,
//! `lockline-faults contender ...`), each reaching the members through its own
//! [`TcpProxy`](lockline_testkit::TcpProxy)s. Contenders take one lock over and
//! over with lockline's public API and write to the register with their
//! fencing token while they hold it (see [`contender`]). A seeded [`nemesis`]
//! pauses and kills holders, kills waiters, kills and pauses members (the
//! leader half the time), kills a quorum for a moment, and silently
//! blackholes a holder's connections; on PostgreSQL it also resets a holder's
//! connections, kills the whole server and restarts it, crashes one backend
//! (the postmaster then restarts every session), freezes the whole server
//! and silences one of a holder's connections; on MariaDB it resets, kills,
//! freezes and silences likewise; on both it fails over to the standby;
//! on Redis it resets a holder's connections, kills the server and starts it
//! again on the same port with its data directory, and freezes it.
//! The [`checker`] then reads the history: tokens never go back, overlapping
//! critical sections only where fencing caught the stale holder (or it was
//! frozen and wrote nothing), `lost()` seen by every running holder before
//! the next grant, a grant within the recovery bound after every fault, and
//! no entry left at the end.
//!
//! On etcd, ZooKeeper and Redis the register is the test's own: it accepts a token
//! at least as high as the highest it accepted. On PostgreSQL and MariaDB each write is a
//! row inserted into a table of the database in lockline-sql's
//! `FencedTransaction`, over the contender's own connection (through its
//! proxy), which commits only while the lock is still held: the guarantee a
//! team that locks its own tables relies on, and the stronger fence (a stale
//! write is refused as soon as the lock is gone, not only once a newer holder
//! has written). A write whose commit got no answer is read back from the
//! table before the check.
//!
//! With [`Config::modes`] (`--modes`) the contenders take a lock-mode
//! resource instead, in random modes with conversions, PW and EX holders
//! writing a register in the lock's own store with `write_if_held`; the
//! checker judges holders by their modes (docs/faults.md, "Lock modes").
//!
//! The short run is an integration test (`tests/faults_randomized.rs`, part of
//! `cargo test --workspace`); the long one is the binary:
//!
//! ```text
//! cargo run --release -p lockline-faults -- --backend etcd --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend postgres --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend mariadb --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend redis --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend redis-volatile --seconds 600 --seed 7
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod backend;
pub mod checker;
pub mod clock;
mod config;
pub mod contender;
pub mod fleet;
pub mod history;
pub mod nemesis;
pub mod rng;
mod run;
pub mod servers;

pub use crate::backend::Backend;
pub use crate::config::Config;
pub use crate::run::{run, LOCK};
