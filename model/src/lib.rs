//! A model of lockline's queue protocol — the one wait rule of DESIGN §4,
//! extended to the six lock modes of a VMS-style lock manager — checked
//! exhaustively with [stateright](https://docs.rs/stateright).
//!
//! # What is modelled
//!
//! - **A server** holding, per resource, a queue of [entries](state::Entry):
//!   an id (the creation order, etcd's create revision), the owning client
//!   (one session per client), a [`Mode`] (the one granted, or the one asked
//!   for while waiting), a *granted* mark, the mode an up-conversion asks for
//!   and when that mark was written (`since`), and a fencing token. A
//!   revision counter gives ids and tokens. Beside the queue, the **lock
//!   value block**'s holder: the entry a PW or EX grant named. Next to
//!   each queue stands a **fenced resource** that accepts a write only with a token at least as
//!   high as the highest it accepted.
//! - **Clients**, each running a short [script](Op) on its own session:
//!   append a request and wait, convert, write, release. A client waits on
//!   exactly one entry; when told that entry is gone or no longer blocks
//!   it, it reads the queue once and decides: granted (by a release that
//!   handed it the lock, or by its own write), or wait on the next
//!   blocker. A release reads the queue, then hands the lock over in a
//!   separate write. A `try_` request that would wait removes its entry (a
//!   write of its own), a timed one may give up at any moment (removing its
//!   entry, or taking its conversion back).
//! - **Up-conversions in two phases**, as `ResourceGuard::up` does them:
//!   a read, the mark (one write), then reads that decide, each a separate
//!   step that any other step may come between (see below).
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
//!   **up-conversion**, CW ⇄ PR included, made of separate steps:
//!   1. *The read before the mark* ([`Action::Step`]), counting the entry
//!      as converting: if it would wait and lie on a cycle, the conversion
//!      fails with a deadlock, writing nothing; if it would wait and may
//!      not (a try), it gives up, writing nothing; otherwise:
//!   2. *The mark* ([`Action::Mark`]): one write of the entry's own value
//!      (its condition is the entry's own version, which only its owner
//!      writes), stamped with its place in the server's order of writes.
//!      From here on every request reading the queue counts the entry with
//!      both modes.
//!   3. *A read after the mark* ([`Action::ReadAfterMark`], and again after
//!      each wake-up): if the entry lies on a cycle whose other conversions
//!      were all marked before it — a cycle its own mark closed — it gives
//!      up ([`Action::TakeBack`], a later separate step, writes its held mode
//!      back). Otherwise it is granted when its new mode is compatible with
//!      every other granted entry *and every earlier request still waiting*,
//!      or waits on the first such entry in queue order.
//!   4. *The grant* ([`Action::GrantFromRead`]), a later separate step: one
//!      write conditioned on every entry of that read being at the version
//!      read; if one changed, it reads again (step 3). The same write
//!      writes again, as they are, the other entries converting to a mode
//!      its new one conflicts with (see below).
//! - **Deadlock**: entries and "is kept waiting by" edges (a request to
//!   each earlier entry it conflicts with, a conversion to each granted
//!   entry and earlier waiting request its new mode conflicts with) form a
//!   graph; a cycle of waiting entries is a deadlock. Only a mark adds edges
//!   that can close a cycle, and every edge it adds touches its own entry,
//!   so every cycle goes through the conversion whose mark closed it, the
//!   latest on it; that conversion's read after its mark comes after the
//!   cycle closed, finds it (if nothing broke it meanwhile) and gives up.
//!   "Marked last of every conversion on a cycle with me", the rule as first
//!   coded, defers to a later mark that closed a *different* cycle; once
//!   that one gives up, the cycle left is one whose closing conversion has
//!   read already and sleeps ([`Rule::DeferToAnyLaterMark`]).
//! - **Grants are conditioned writes.** The code reads, decides, and writes
//!   the grant conditioned on the entries the decision read still being at
//!   the versions read (a request: those before it and itself; a
//!   conversion: all).
//!   - *A request's* read, decision and grant are one step in the model,
//!     which is the same: the write applies only if the entries before it
//!     are as read, and a request never looks at later entries. An entry
//!     appended after its read conflicts with it only through a conversion,
//!     which counts it as an earlier waiting request until its grant, and
//!     as granted after.
//!   - *A conversion's* grant is a step of its own, after the read that
//!     decided it, with versions compared. An entry appended after that
//!     read is in no condition. It read the mark, so it is granted beside
//!     the conversion only in a mode compatible with both modes; but once
//!     granted it may convert up, and a conversion counts another granted
//!     entry by the mode it holds, not the one it is converting to. So the
//!     later conversion may be granted a mode that conflicts with the first
//!     one's new mode, and both grants' conditions hold. The sound rule has
//!     each conversion's grant write again every other entry converting to
//!     a mode its own conflicts with; the first conversion's condition (its
//!     own entry's version) then fails, and it reads again and waits
//!     ([`Rule::ConversionGrantLeavesOthers`], a race found in the code
//!     under load before the model had this step).
//!   - *The grant before the mark* is not sound at all: appended after that
//!     read, a request reads the entry unmarked, and is granted beside it
//!     ([`Rule::GrantBeforeMark`]).
//!   - Versions matter only while a conversion's grant is pending; the
//!     model sets them to 0 when none is, so that states differing only in
//!     how often an entry was written are one.
//! - **The releaser hands the lock over.** A release is two steps, and
//!   anything may happen between them:
//!   1. *The read* (the release's [`Action::Step`]): walking the queue in
//!      order without its own entry, it picks every waiting request (not a
//!      conversion) that no earlier entry left keeps waiting, by the request
//!      rule above (granted modes, converting entries by both modes, earlier
//!      waiting requests, the requests picked before it): exactly what each
//!      would decide for itself after the release. Only requests that wait
//!      ask to be handed the lock: a `try_` request's entry is never picked
//!      (it counts as an earlier entry all the same). A read that finds the
//!      value block naming a holder that is gone (lost with its session)
//!      picks nobody: a waiter may owe a lock-delay, which the code's
//!      releaser cannot see, so the waiters decide for themselves.
//!   2. *The write* ([`Action::HandOver`]): one write conditioned on its own
//!      entry and every entry of the read up to the last one picked (those
//!      picked and every one before them) being as read. It deletes its
//!      own entry and marks the picked requests granted, all with one
//!      token, that write's revision; a PW or EX request granted is named
//!      in the value block (as its own grant would have named it), and
//!      otherwise the release clears its own name there. If an entry of
//!      the condition changed, it falls back to the plain release: it
//!      deletes its own entry and grants nobody; its waiters are woken by
//!      the deletion and decide for themselves. The model also lets the
//!      condition fail at any write ([`Action::ReleaseOnly`]), for what it
//!      does not show (a blocked mark, a change undone since the read).
//!      With nobody to hand over to, the release is one step: a fenced
//!      delete, whatever came between its read and it.
//!
//!   Entries appended after the read come after every entry picked, and a
//!   request never looks at later entries; a conversion later than a picked
//!   request counted it (as an earlier waiting request) before and counts
//!   it (as granted) after. So the condition needs no entry after the last
//!   one picked, and needs every entry before it: a holder ahead that
//!   converts up between the read and the write is granted beside the
//!   request handed the lock ([`Rule::HandOverUnconditionedEarlier`]).
//! - **A waiter learns from its read that it was handed the lock**: the
//!   release's deletion wakes the waiters that waited on it; each reads
//!   once, finds its entry granted, takes the token from the entry and
//!   writes nothing. A waiter that finds its entry not granted decides as
//!   before (and grants itself if nothing blocks it: after a fallback, or
//!   when its blocker left without a release). A late or duplicated
//!   wake-up of a waiter that already learnt is ignored; one that arrives
//!   first only makes the waiter read the truth sooner.
//! - **A cancelled request whose entry was handed the lock** was a holder
//!   for a moment: its removal is a release, and writes the value block as
//!   a release does (it clears the name, leaving the value the releaser
//!   wrote); left naming it, the block would look lost by a holder
//!   ([`Rule::CancelKeepsBlockName`]). Its waiters, woken by the removal,
//!   decide for themselves.
//! - **Tokens**: every grant takes a fresh token from the revision counter
//!   (the revision of the write that marks the entry granted: its own, or
//!   the hand-over's, shared by the requests that write grants), and so
//!   does an up-conversion to a writing mode (CW, PW, EX).
//! - **Wake-ups**: a waiter watches the one entry it waits on and is woken
//!   when that entry is removed, or changed so that it no longer keeps the
//!   waiter waiting (a down-conversion, a conversion granted or taken back);
//!   a change that leaves it blocking (a request granted in the mode it
//!   asked for, a mark) wakes no one. A client woken for an entry it no
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
//!    2c. a grant in CW, PW or EX (or an up-conversion to one) takes a
//!    token no lower than any held in the queue;
//! 3. FIFO: nothing is granted while an earlier incompatible request or
//!    conversion waits;
//! 4. no cycle of waiting entries stands once every conversion on it has
//!    made its read after its mark and sleeps (a cycle may stand until
//!    then); 4b. a conversion fails with a deadlock only on a cycle its own
//!    mark closed (so never off a cycle, and never because a later mark
//!    closed it: that one gives up);
//! 5. once every client has ended, no entry is left; 5b. an entry is marked
//!    converting only while its conversion runs (no mark is left behind);
//! 6. a removal or change wakes only the clients that waited on that entry
//!    and that it lets on;
//! 7. a waiter no longer blocked by the entry it waits on has a wake-up on
//!    its way (no lost wake-up);
//! 8. every client ends (`eventually`);
//! 9. the value block names an entry that is gone only when that entry's
//!    session expired (a release, a cancel, a withdrawn try clear the name);
//!    9b. it names every PW or EX holder in the queue: a grant outside PW
//!    and EX clears a lost holder's name as the read that decided it had
//!    it, and must never clear a later holder's (a conversion's grant is a
//!    step of its own, so its read may be older than that holder; a PW or
//!    EX grant writes again every earlier entry that still waits or
//!    converts, so such a grant fails and reads again);
//!
//! and `sometimes` properties showing that grants, up-conversions, detected
//! deadlocks (also on a read after the mark), holders whose session
//! expired, stale writes refused, late wake-ups ignored, grants by
//! hand-over learnt, hand-overs that fell back to the plain release and
//! waiters handed the lock then cancelled are all reached.
//!
//! # Bounds
//!
//! Every configuration ([`Config::all`]) has three clients (two in the
//! two-resource one), one resource (two in one), two to five steps per
//! client, at most one session expiry (none in two), one duplicated wake-up
//! (none in the mixed DLM one) and, for the mutex, one retried append. The
//! checker explores every reachable state, breadth first, on one thread;
//! all of them together took about 26 seconds in a test build on a
//! machine busy with a full test run and two CPU hogs, about six on a
//! quiet one before a conversion's grant became a step of its own (the workspace's dev
//! profile optimises this crate and stateright; unoptimised it is several
//! times that). The largest, the mixed DLM configuration, has
//! about 850,000 distinct states (750,000 before a conversion's grant
//! became a step of its own). `cargo run -p lockline-model --example check` prints the counts
//! and times; `--example trace` prints a counterexample step by step.
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
//! ([`Rule::PairwiseDeadlockDetection`]); six are pitfalls of the
//! two-phase conversion ([`Rule::GrantBeforeMark`],
//! [`Rule::ConversionGrantLeavesOthers`],
//! [`Rule::EarliestMarkGivesUp`], [`Rule::DeferToAnyLaterMark`],
//! [`Rule::EveryConversionOnCycleGivesUp`], [`Rule::KeepMarkOnDeadlock`]);
//! five are pitfalls of the hand-over ([`Rule::HandOverUnconditionedEarlier`],
//! [`Rule::HandOverPastWaiters`], [`Rule::HandOverTokenAtRead`],
//! [`Rule::HandOverToTry`], [`Rule::CancelKeepsBlockName`]); one is the
//! value block's ([`Rule::WriterGrantLeavesPending`]).
//!
//! # Not modelled
//!
//! See "The queue rule, model-checked" in `docs/design-notes.md`: timing
//! (TTLs, lock-delay, restart grace), the lock value block's value (only
//! its holder's name is modelled) and blocking notifications, same-session
//! queueing, foreign entries, multi-lock, and faults of the round trips
//! other than the append.

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
