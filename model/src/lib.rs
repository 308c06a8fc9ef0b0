//! A model of lockline's queue protocol — the one wait rule of DESIGN §4,
//! extended to the six lock modes of a VMS-style lock manager — checked
//! exhaustively with [stateright](https://docs.rs/stateright) before the
//! modes are coded.
//!
//! # What is modelled
//!
//! - **A server** holding, per resource, a queue of [entries](state::Entry):
//!   an id (the creation order, etcd's create revision), the owning client
//!   (one session per client), a [`Mode`] (the one granted, or the one asked
//!   for while waiting), a *granted* mark, the mode an up-conversion asks for,
//!   and a fencing token. A revision counter gives ids and tokens. Next to
//!   each queue stands a **fenced resource** that accepts a write only with
//!   a token at least as high as the highest it accepted.
//! - **Clients**, each running a short [script](Op) on its own session:
//!   append a request and wait, convert, write, release. A client waits on
//!   exactly one entry; when told that entry was removed or changed, it
//!   reads the queue once and decides: granted, or wait on the next blocker.
//!   A `try_` request is refused at once, a timed one may give up at any
//!   moment (removing its entry, or keeping its granted mode when it was a
//!   conversion).
//! - **Faults**, within small budgets ([`Config`]): a session may expire at
//!   any moment (the server deletes its entries; the client keeps believing
//!   what it believed, and may write, until it learns); a wake-up may be
//!   duplicated and any wake-up may arrive late (after its client moved on);
//!   an append may be retried, both copies reaching the server in any order,
//!   at any later time, even after the attempt was given up or the lock
//!   released.
//!
//! # The sound rule ([`Rule::Sound`])
//!
//! - **A request** in mode `m` is granted when no earlier entry conflicts
//!   with `m`; a converting entry conflicts through its granted mode *or*
//!   its new mode. Otherwise it waits on the nearest earlier conflicting
//!   entry. Later entries are never looked at.
//! - **A down-conversion** (every mode compatible with the old one is
//!   compatible with the new one) is granted at once. Anything else is an
//!   **up-conversion**, CW ⇄ PR included: granted when its new mode is
//!   compatible with every other granted entry *and every earlier request
//!   still waiting*; otherwise it waits on the first such entry, each in turn.
//!   Every later request waits for it (it counts with its new mode).
//! - **Conversion deadlock** is looked for when an up-conversion is asked:
//!   if the entry now lies on a cycle of entries waiting on each other
//!   (requests and conversions, each with an edge to every entry that keeps
//!   it waiting), the conversion fails at once and the entry keeps its
//!   granted mode.
//! - **Tokens**: every grant takes a fresh token from the revision counter
//!   (the revision of the write that marks the entry granted), and so does an
//!   up-conversion to a writing mode (CW, PW, EX). Deciding and marking are
//!   one atomic step (an etcd transaction, a ZooKeeper multi).
//! - **Wake-ups**: removing an entry, or changing its mode or its conversion
//!   (a down-conversion, a conversion granted or given up), wakes exactly the
//!   clients that wait on that entry. A client woken for an entry it no
//!   longer waits on ignores it; a client that finds its own entry gone has
//!   lost its session.
//! - **Appends** are idempotent per attempt for the attempt's whole life: a
//!   late copy of an append the server has seen, or whose attempt was given
//!   up, makes no entry. A release deletes the releaser's own entry only.
//!
//! The mutex (every entry EX), the election (EX, the holder is the leader,
//! proclaiming is a fenced write), the read/write lock (PR and EX) and the
//! semaphore ([`Queueing::Permits`]: hold beside fewer than `n` earlier
//! entries, otherwise wait on the entry `n` places earlier) are
//! configurations of the same model.
//!
//! # Properties ([`property`])
//!
//! 1. no two live sessions hold one resource in incompatible modes (a
//!    semaphore: no more holders than permits);
//! 2. a client whose session expired never gets a write accepted after a
//!    newer grant's write; 2b. a live holder's write is never refused;
//! 3. FIFO: nothing is granted while an earlier incompatible request or
//!    conversion waits;
//! 4. no cycle of waiting entries ever stands (every conversion deadlock is
//!    detected when it arises);
//! 5. once every client has ended, no entry is left;
//! 6. a removal or change wakes only the clients that waited on that entry;
//! 7. a waiter no longer blocked by the entry it waits on has a wake-up on
//!    its way (no lost wake-up);
//! 8. every client ends (`eventually`);
//!
//! and `sometimes` properties showing that grants, up-conversions, detected
//! deadlocks, holders whose session expired, stale writes refused and late
//! wake-ups ignored are all reached.
//!
//! # Bounds
//!
//! Every configuration ([`Config::all`]) has three clients (two in the
//! two-resource one), one resource (two in one), two to five steps per
//! client, at most one session expiry, one duplicated wake-up and, for the
//! mutex, one retried append. The checker explores every reachable state,
//! breadth first, on one thread; all of them together take about ten seconds
//! in a debug build (the largest, the mixed DLM configuration, has about
//! 250,000 distinct states). `cargo run -p lockline-model --example check`
//! prints the counts and times.
//!
//! # Broken twins
//!
//! Each property is shown to catch something: every variant of [`Rule`] but
//! [`Rule::Sound`] breaks the rule in one place and violates the property
//! [`Rule::breaks`] names, in the configuration [`Rule::shown_on`] names,
//! where the sound rule keeps every property. Three of them are DESIGN §4's
//! mode rows read literally ([`Rule::ConversionPassesEarlierWaiters`],
//! [`Rule::ConvertingCountsNewModeOnly`], [`Rule::WakeOnRemovalOnly`]); one
//! is the Linux DLM's pairwise deadlock check
//! ([`Rule::PairwiseDeadlockDetection`]).
//!
//! # Not modelled
//!
//! See "The queue rule, model-checked" in `docs/design-notes.md`: timing
//! (TTLs, lock-delay, restart grace), the lock value block and blocking
//! notifications, same-session queueing, foreign entries, multi-lock, and
//! faults of the round trips other than the append (each is one atomic step).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod check;
mod config;
mod mode;
mod model;
pub mod property;
mod rule;
pub mod state;

pub use check::{check, Report};
pub use config::{Config, Op, Patience, Queueing};
pub use mode::Mode;
pub use model::{Action, QueueModel};
pub use rule::Rule;
