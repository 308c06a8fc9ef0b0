//! What lockline's benchmark programs share, so that each backend's
//! `bench_*`, `crowd_*` and `scale_*` examples bring only their server
//! start-up, their client and their server-side counters. Not published.
//!
//! - **Handoff benchmarks** (`bench_*`): their flags ([`BenchArgs`], and
//!   [`OwnFlags`] for a program's own); one client's timed sequential calls
//!   for B_write ([`sequential`]); the measured loop of N contenders on one
//!   lock, for lockline and for every baseline alike ([`Contest`], one
//!   [`Contender`] handle per task); lockline's N contenders, each its own
//!   client and session, and their wakeups per release ([`Contenders`]);
//!   p50/p99 ([`Latencies`]) and the ratio and target lines ([`report`]).
//! - **The crowd** (`crowd_*`): P child processes of the program itself,
//!   driven line by line ([`Crowd`], [`run_plan`]); a child's contenders
//!   and their report ([`CrowdChild::contend`]).
//! - **Against a peer library** ([`versus`]): lockline and another client
//!   (Go's `concurrency`, Curator) on the same server, the same workload,
//!   grants/s and the client's and server's CPU time per grant.
//! - **Lock modes** ([`lock_modes`]): on any backend, for each N, the
//!   mutex and a resource in EX side by side (EX ÷ mutex), and a mixed
//!   workload of the six modes with conversions (grants/s, wakeups per
//!   release).
//! - **Scale** (`scale_*`): many locks on one session and many sessions in
//!   one process ([`scale::run`]), with a counting allocator and a
//!   byte-counting proxy; a backend implements [`scale::ScaleServer`].
//!
//! The parent side of the crowd harness deals only in processes and lines;
//! everything that takes a lock goes through lockline's public API, so the
//! same code measures every backend.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod args;
mod contenders;
mod contest;
mod crowd;
mod crowd_child;
mod latency;
pub mod lock_modes;
pub mod report;
pub mod scale;
pub mod versus;

pub use args::{usage_exit, BenchArgs, OwnFlags};
pub use contenders::{counts, Contenders, SESSION_TTL};
pub use contest::{Contender, Contest, Outcome, Sampling};
pub use crowd::{
    run_plan, run_plan_with, unix_nanos, Crowd, CrowdArgs, CrowdChild, CrowdCounts, CrowdResult, ExtraColumns,
    GrantRecord, NoExtraColumns, Window, CHILD_FLAG,
};
pub use latency::{ms, rss_kib, sequential, Latencies};

/// Any error, for the benchmark programs.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A benchmark program's result.
pub type BoxResult<T> = Result<T, BoxError>;
