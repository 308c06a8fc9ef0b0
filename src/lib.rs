#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod acquire;
pub mod backend;
mod client;
mod contender;
mod election;
mod error;
mod guard;
mod lock_mode;
mod memory;
mod mode_rule;
mod multilock;
mod multiresource;
mod mutex;
mod name;
mod options;
mod resource;
mod rwlock;
mod selector;
mod semaphore;
mod sequencer;
mod session;
mod stats;
mod tls;
mod token;
mod wait;
mod write;

// The chapters under `docs/`: their Rust examples are tested as doc tests,
// as the README's are through the crate documentation.
#[cfg(doctest)]
mod chapters {
    #[doc = include_str!("../docs/recipes.md")]
    mod recipes {}
    #[doc = include_str!("../docs/fenced-writes.md")]
    mod fenced_writes {}
    #[doc = include_str!("../docs/sequencers.md")]
    mod sequencers {}
    #[doc = include_str!("../docs/guarantees.md")]
    mod guarantees {}
    #[doc = include_str!("../docs/metrics.md")]
    mod metrics {}
    #[doc = include_str!("../docs/etcd.md")]
    mod etcd {}
    #[doc = include_str!("../docs/zookeeper.md")]
    mod zookeeper {}
    #[doc = include_str!("../docs/redis.md")]
    mod redis {}
    #[doc = include_str!("../docs/sql.md")]
    mod sql {}
    #[doc = include_str!("../docs/interop.md")]
    mod interop {}
    #[doc = include_str!("../docs/security.md")]
    mod security {}
    #[doc = include_str!("../docs/cli.md")]
    mod cli {}
    #[doc = include_str!("../docs/benchmarks.md")]
    mod benchmarks {}
    #[doc = include_str!("../docs/memory.md")]
    mod memory {}
    #[doc = include_str!("../docs/faults.md")]
    mod faults {}
    #[doc = include_str!("../docs/repository.md")]
    mod repository {}
}

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(feature = "metrics")]
pub use stats::metrics;
use stats::observe;

pub use backend::EntryKind;
pub(crate) use backend::{AppendRequest, Appended, Backend, BackendSession, Conflicts, Earlier, Entry};
pub use client::Client;
pub use contender::Contender;
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, Error, Result};
pub use lock_mode::LockMode;
pub use memory::MemoryBackend;
pub use mode_rule::LockValue;
pub use multilock::{MultiGuard, MultiLock};
pub use multiresource::{MultiResource, MultiResourceGuard};
pub use mutex::{Mutex, MutexGuard};
pub use name::MAX_NAME_LEN;
pub use options::{SessionOptions, SessionState, MAX_LOCK_DELAY, MAX_TTL, MIN_TTL};
pub use resource::{ModeContender, Resource, ResourceGuard, MAX_LOCK_VALUE};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use selector::{LeaderSelector, Term};
pub use semaphore::{Permit, Semaphore, MAX_PERMITS};
pub use sequencer::{Mode, Sequencer};
pub use session::Session;
pub use stats::ClientStats;
pub use tls::Tls;
pub use token::FencingToken;
pub use write::Write;

/// Re-exported so backends and users name the same `async_trait`.
pub use async_trait::async_trait;
