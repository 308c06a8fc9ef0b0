//! What the model runs: how entries conflict, the clients' scripts, and how
//! many faults the network and the sessions may show.

use crate::Mode;

/// How long a request or conversion may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Patience {
    /// Until granted, or until the session is lost (`lock()`).
    Wait,
    /// Not at all: refused at once when it would wait (`try_lock()`); leaves
    /// no entry (a request) or keeps the granted mode (a conversion).
    Try,
    /// Until a deadline that may pass at any moment (`lock_timeout()`, or a
    /// dropped future): cancelled, leaving no entry (a request) or keeping
    /// the granted mode (a conversion).
    Timeout,
}

/// One step of a client's script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Append an entry in `mode` to `resource`'s queue and wait for the grant.
    Lock {
        /// The resource's index.
        resource: u8,
        /// The mode asked for.
        mode: Mode,
        /// How long it may wait.
        patience: Patience,
    },
    /// Convert the granted entry on `resource` to `mode` (skipped when the
    /// client holds nothing there).
    Convert {
        /// The resource's index.
        resource: u8,
        /// The new mode.
        mode: Mode,
        /// How long an up-conversion may wait.
        patience: Patience,
    },
    /// Write to the fenced resource with the held token (skipped unless the
    /// client believes it holds PW or EX there). A client whose session
    /// expired still writes until it learns of the loss.
    Write {
        /// The resource's index.
        resource: u8,
    },
    /// Release the entry held on `resource` (a fenced delete).
    Release {
        /// The resource's index.
        resource: u8,
    },
}

impl Op {
    /// Locks `resource` in `mode`, waiting as long as it takes.
    pub fn lock(resource: u8, mode: Mode) -> Op {
        Op::Lock {
            resource,
            mode,
            patience: Patience::Wait,
        }
    }

    /// Locks `resource` in `mode`, giving up at a deadline.
    pub fn lock_timeout(resource: u8, mode: Mode) -> Op {
        Op::Lock {
            resource,
            mode,
            patience: Patience::Timeout,
        }
    }

    /// Locks `resource` in `mode` only if it is granted at once.
    pub fn try_lock(resource: u8, mode: Mode) -> Op {
        Op::Lock {
            resource,
            mode,
            patience: Patience::Try,
        }
    }

    /// Converts the entry held on `resource` to `mode`, waiting as long as it takes.
    pub fn convert(resource: u8, mode: Mode) -> Op {
        Op::Convert {
            resource,
            mode,
            patience: Patience::Wait,
        }
    }

    /// Converts the entry held on `resource` to `mode`, giving up at a deadline.
    pub fn convert_timeout(resource: u8, mode: Mode) -> Op {
        Op::Convert {
            resource,
            mode,
            patience: Patience::Timeout,
        }
    }

    /// A fenced write to `resource`.
    pub fn write(resource: u8) -> Op {
        Op::Write { resource }
    }

    /// Releases `resource`.
    pub fn release(resource: u8) -> Op {
        Op::Release { resource }
    }

    /// The resource the step is about.
    pub fn resource(self) -> u8 {
        match self {
            Op::Lock { resource, .. }
            | Op::Convert { resource, .. }
            | Op::Write { resource }
            | Op::Release { resource } => resource,
        }
    }

    /// The patience of a lock or a conversion ([`Patience::Wait`] for the rest).
    pub fn patience(self) -> Patience {
        match self {
            Op::Lock { patience, .. } | Op::Convert { patience, .. } => patience,
            Op::Write { .. } | Op::Release { .. } => Patience::Wait,
        }
    }
}

/// How entries of one resource conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queueing {
    /// By their modes and the VMS matrix: the mutex (every entry EX), the
    /// election (EX, the holder is the leader), the read/write lock (PR and
    /// EX) and the six DLM modes.
    Modes,
    /// Every entry is a permit of a semaphore of this many permits: an entry
    /// holds when fewer earlier entries exist, and otherwise waits on the
    /// entry that many places earlier.
    Permits(u8),
}

/// One configuration of the model: the recipe (how entries conflict), the
/// clients' scripts, and the fault budgets.
///
/// Each client runs its script once, on its own session; its session may
/// expire at any moment while expiries remain. Each budget bounds how often a
/// fault happens in one run, which keeps the state space finite and small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A short name for reports.
    pub name: &'static str,
    /// How entries conflict.
    pub queueing: Queueing,
    /// How many resources (lock names) there are.
    pub resources: u8,
    /// One script per client.
    pub scripts: Vec<Vec<Op>>,
    /// How many sessions may expire in one run.
    pub expiries: u8,
    /// How many wake-up notifications may be delivered twice in one run.
    pub duplicate_wakes: u8,
    /// How many appends may be sent again (their answer lost) in one run;
    /// both copies reach the server, in any order, at any later time.
    pub append_retries: u8,
}

impl Config {
    fn modes(name: &'static str, scripts: Vec<Vec<Op>>) -> Config {
        let resources = scripts.iter().flatten().map(|op| op.resource() + 1).max().unwrap_or(1);
        Config {
            name,
            queueing: Queueing::Modes,
            resources,
            scripts,
            expiries: 1,
            duplicate_wakes: 1,
            append_retries: 0,
        }
    }

    /// The mutex: three clients lock EX, write fenced, release; the second
    /// gives up at a deadline. One session may expire, one wake-up may be
    /// duplicated, one append may be retried.
    pub fn mutex() -> Config {
        use Mode::Ex;
        Config {
            append_retries: 1,
            ..Config::modes(
                "mutex",
                vec![
                    vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
                    vec![Op::lock_timeout(0, Ex), Op::write(0), Op::release(0)],
                    vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
                ],
            )
        }
    }

    /// The election: three candidates campaign (EX), proclaim (a fenced
    /// write) and resign. The holder is the leader.
    pub fn election() -> Config {
        use Mode::Ex;
        let candidate = vec![Op::lock(0, Ex), Op::write(0), Op::release(0)];
        Config::modes("election", vec![candidate.clone(), candidate.clone(), candidate])
    }

    /// The read/write lock: a reader, a writer, and a reader that only tries
    /// (PR, EX, PR).
    pub fn read_write() -> Config {
        use Mode::{Ex, Pr};
        Config::modes(
            "read/write",
            vec![
                vec![Op::lock(0, Pr), Op::release(0)],
                vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
                vec![Op::try_lock(0, Pr), Op::release(0)],
            ],
        )
    }

    /// A semaphore of `permits` permits, three clients acquiring and releasing.
    pub fn semaphore(permits: u8) -> Config {
        let client = vec![Op::lock(0, Mode::Ex), Op::release(0)];
        Config {
            queueing: Queueing::Permits(permits),
            ..Config::modes("semaphore", vec![client.clone(), client.clone(), client])
        }
    }

    /// The six modes mixed on one resource: a PR holder converts up to EX,
    /// writes and converts down to CR; a CR holder converts up to PW with a
    /// deadline and writes; a PR request with a deadline converts up to EX.
    /// One session may expire; no wake-up is duplicated (the other
    /// configurations duplicate one; here it would triple the states, and
    /// late wake-ups are still reached).
    pub fn dlm() -> Config {
        use Mode::{Cr, Ex, Pr, Pw};
        Config {
            duplicate_wakes: 0,
            ..Config::modes(
                "DLM modes mixed",
                vec![
                    vec![
                        Op::lock(0, Pr),
                        Op::convert(0, Ex),
                        Op::write(0),
                        Op::convert(0, Cr),
                        Op::release(0),
                    ],
                    vec![
                        Op::lock(0, Cr),
                        Op::convert_timeout(0, Pw),
                        Op::write(0),
                        Op::release(0),
                    ],
                    vec![Op::lock_timeout(0, Pr), Op::convert(0, Ex), Op::release(0)],
                ],
            )
        }
    }

    /// Conversions and their deadlock: two PR holders convert up to EX (one
    /// of them with a deadline), a third client asks for EX and writes.
    pub fn conversion_deadlock() -> Config {
        use Mode::{Ex, Pr};
        Config::modes(
            "PR→EX deadlock",
            vec![
                vec![Op::lock(0, Pr), Op::convert(0, Ex), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Pr), Op::convert_timeout(0, Ex), Op::release(0)],
                vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
            ],
        )
    }

    /// A conversion deadlock through a waiting request: a PR holder
    /// converts to EX, a PW request waits behind it, and a CR holder
    /// (granted beside both) converts to PR, which must wait for the earlier
    /// PW request, which waits for the first holder, which waits for the CR
    /// holder. No two of them block each other.
    pub fn conversion_cycle() -> Config {
        use Mode::{Cr, Ex, Pr, Pw};
        Config::modes(
            "PR→EX, CR→PR cycle",
            vec![
                vec![Op::lock(0, Pr), Op::convert(0, Ex), Op::release(0)],
                vec![Op::lock(0, Pw), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Cr), Op::convert(0, Pr), Op::release(0)],
            ],
        )
    }

    /// Fencing across an up-conversion: a CR holder converts to PW and
    /// writes, beside a PW writer whose session may expire, and a third
    /// client that reads (PR).
    pub fn conversion_token() -> Config {
        use Mode::{Cr, Pr, Pw};
        Config::modes(
            "CR→PW token",
            vec![
                vec![Op::lock(0, Cr), Op::convert(0, Pw), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Pw), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Pr), Op::release(0)],
            ],
        )
    }

    /// An up-conversion behind an earlier waiting request: EX holder, a PR
    /// request waiting behind it, and an NL holder (granted beside both)
    /// converting to EX.
    pub fn conversion_behind_waiter() -> Config {
        use Mode::{Ex, Nl, Pr};
        Config::modes(
            "NL→EX behind a waiter",
            vec![
                vec![Op::lock(0, Ex), Op::release(0)],
                vec![Op::lock(0, Pr), Op::release(0)],
                vec![Op::lock(0, Nl), Op::convert(0, Ex), Op::release(0)],
            ],
        )
    }

    /// Two up-conversions where the later entry comes after the earlier
    /// one's read: a PR holder converts up to PW and writes; an NL request
    /// (granted beside the mark) converts up to PR; a CR request with a
    /// deadline. The first conversion's grant may be decided on a read
    /// taken before the NL entry existed.
    pub fn conversion_beside_later_conversion() -> Config {
        use Mode::{Cr, Nl, Pr, Pw};
        Config::modes(
            "PR→PW beside a later NL→PR",
            vec![
                vec![Op::lock(0, Pr), Op::convert(0, Pw), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Nl), Op::convert(0, Pr), Op::release(0)],
                vec![Op::lock_timeout(0, Cr), Op::release(0)],
            ],
        )
    }

    /// A grant outside PW and EX clearing a lost holder's name from the
    /// value block: an NL holder converts up to CR, a PW holder whose
    /// session may expire (leaving the block naming it), a later PW
    /// request. No wake-up is duplicated.
    pub fn conversion_clears_block() -> Config {
        use Mode::{Cr, Nl, Pw};
        Config {
            duplicate_wakes: 0,
            ..Config::modes(
                "NL→CR clears a lost name beside a later PW",
                vec![
                    vec![Op::lock(0, Nl), Op::convert(0, Cr), Op::release(0)],
                    vec![Op::lock(0, Pw), Op::release(0)],
                    vec![Op::lock(0, Pw), Op::release(0)],
                ],
            )
        }
    }

    /// A CW holder converting to PR (an up-conversion that is not a
    /// refinement: PR admits what CW excluded), another CW holder, and a PR
    /// request.
    pub fn sideways_conversion() -> Config {
        use Mode::{Cw, Pr};
        Config::modes(
            "CW→PR",
            vec![
                vec![Op::lock(0, Cw), Op::convert(0, Pr), Op::release(0)],
                vec![Op::lock(0, Cw), Op::release(0)],
                vec![Op::lock(0, Pr), Op::release(0)],
            ],
        )
    }

    /// Down-conversions across two resources: an EX holder of resource 0
    /// converts down to NL and then locks resource 1, whose holder asks for
    /// PR on resource 0 before releasing resource 1. No session expires
    /// (an expiry would end any wait, and so hide one that never ends).
    pub fn down_conversion() -> Config {
        use Mode::{Ex, Nl, Pr};
        Config {
            expiries: 0,
            ..Config::modes(
                "EX→NL, two resources",
                vec![
                    vec![
                        Op::lock(0, Ex),
                        Op::convert(0, Nl),
                        Op::lock(1, Ex),
                        Op::release(1),
                        Op::release(0),
                    ],
                    vec![Op::lock(1, Ex), Op::lock(0, Pr), Op::release(0), Op::release(1)],
                ],
            )
        }
    }

    /// Three PR holders convert up to EX and release, waiting as long as
    /// it takes; no session expires (an expiry would end any wait), one
    /// wake-up may be duplicated. Each pair of them is a conversion
    /// deadlock: when the conversion marked last gives up, the other two
    /// still form a cycle, which the later-marked of them must break.
    pub fn three_conversions() -> Config {
        use Mode::{Ex, Pr};
        let client = vec![Op::lock(0, Pr), Op::convert(0, Ex), Op::release(0)];
        Config {
            expiries: 0,
            ..Config::modes("three PR→EX", vec![client.clone(), client.clone(), client])
        }
    }

    /// A hand-over past an up-conversion ahead of it: an NL holder converts
    /// up to PW and writes, a CR holder releases, an EX request waits behind
    /// the CR holder and writes. The CR holder's release may read the queue
    /// before the NL holder's mark and write after its grant.
    pub fn hand_over_past_conversion() -> Config {
        use Mode::{Cr, Ex, Nl, Pw};
        Config::modes(
            "hand-over past NL→PW",
            vec![
                vec![Op::lock(0, Nl), Op::convert(0, Pw), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Cr), Op::release(0)],
                vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
            ],
        )
    }

    /// A hand-over with a `try_` request in the queue: an EX holder writes
    /// and releases, an EX request that only tries (its entry stays in the
    /// queue from its read to its removal), and a PR request.
    pub fn hand_over_past_try() -> Config {
        use Mode::{Ex, Pr};
        Config::modes(
            "hand-over past a try",
            vec![
                vec![Op::lock(0, Ex), Op::write(0), Op::release(0)],
                vec![Op::try_lock(0, Ex), Op::write(0), Op::release(0)],
                vec![Op::lock(0, Pr), Op::release(0)],
            ],
        )
    }

    /// Tokens across a hand-over: a PR holder releases, handing the lock
    /// over to a PW request, which writes (its session may expire); a CR
    /// request may come between the release's read and its write, and is
    /// granted at once beside both; its client then locks EX and writes.
    pub fn hand_over_token() -> Config {
        use Mode::{Cr, Ex, Pr, Pw};
        Config::modes(
            "hand-over token",
            vec![
                vec![Op::lock(0, Pr), Op::release(0)],
                vec![Op::lock(0, Pw), Op::write(0), Op::release(0)],
                vec![
                    Op::lock(0, Cr),
                    Op::release(0),
                    Op::lock(0, Ex),
                    Op::write(0),
                    Op::release(0),
                ],
            ],
        )
    }

    /// Every configuration the crate's tests check with the sound rule.
    pub fn all() -> Vec<Config> {
        vec![
            Config::mutex(),
            Config::election(),
            Config::read_write(),
            Config::semaphore(2),
            Config::dlm(),
            Config::conversion_deadlock(),
            Config::conversion_cycle(),
            Config::conversion_token(),
            Config::conversion_behind_waiter(),
            Config::conversion_beside_later_conversion(),
            Config::conversion_clears_block(),
            Config::sideways_conversion(),
            Config::down_conversion(),
            Config::three_conversions(),
            Config::hand_over_past_conversion(),
            Config::hand_over_past_try(),
            Config::hand_over_token(),
        ]
    }
}
