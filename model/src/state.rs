//! The state the checker explores: the server's queues, the clients, the
//! messages in flight, the fault budgets, and ghost facts the properties read.

use crate::Mode;

/// One entry of a resource's queue, as the server stores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The server's creation order (etcd create revision, ZooKeeper sequence).
    pub id: u8,
    /// The client (and so the session) that owns it.
    pub owner: u8,
    /// The append attempt that made it (the index of the client's `Lock` step).
    pub attempt: u8,
    /// The granted mode, or the mode asked for while not granted.
    pub mode: Mode,
    /// Whether its owner was granted it. Written in the same atomic step as
    /// the read that decided the grant.
    pub granted: bool,
    /// The mode an up-conversion asks for, from its mark until it is
    /// granted or taken back.
    pub converting: Option<Mode>,
    /// While converting: when the mark was written, in the server's order of
    /// writes (a revision). Of the conversions on a cycle, the one marked
    /// last gives up.
    pub since: u8,
    /// The fencing token of the grant (0 before it).
    pub token: u8,
    /// How many times the entry was written (its version): a conditional
    /// write applies only if the entries it read are at the versions read.
    pub version: u8,
    /// Ghost: the grant's number on the resource (see [`Resource::grants`]),
    /// which a waiter granted by a hand-over takes with its token.
    pub grant: u8,
}

/// One lock name on the server, and the fenced resource it protects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Resource {
    /// The queue, in creation order.
    pub entries: Vec<Entry>,
    /// The revision counter: entry ids and fencing tokens are taken from it.
    pub revision: u8,
    /// The append attempts the server has seen or was told to abandon,
    /// `(client, attempt)`, sorted: a late copy of one makes no entry.
    pub attempts: Vec<(u8, u8)>,
    /// The highest token the fenced resource accepted a write with.
    pub fence: u8,
    /// Ghost: how many grants (requests and up-conversions) there were.
    pub grants: u8,
    /// Ghost: the newest grant (by [`Resource::grants`]) whose holder got a
    /// write accepted.
    pub newest_writer: u8,
    /// The lock value block's holder: the entry a PW or EX grant named in
    /// it (0: none). A release or a down-conversion out of PW/EX clears the
    /// name as it writes the value; a named entry that is gone lost its
    /// lock without a release, and the block is not valid until the next
    /// PW or EX holder writes it.
    pub block: u8,
}

/// What a client believes it holds on one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// Its entry's id.
    pub entry: u8,
    /// The granted mode.
    pub mode: Mode,
    /// The token it writes with.
    pub token: u8,
    /// Ghost: the grant's number on the resource (see [`Resource::grants`]).
    pub grant: u8,
}

/// Where a client is in its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to run its next step.
    Ready,
    /// Its append is on its way; no answer yet.
    Appending {
        /// The resource.
        resource: u8,
    },
    /// Queued: its entry waits on one other entry.
    Waiting {
        /// The resource.
        resource: u8,
        /// Its own entry.
        entry: u8,
        /// The one entry it waits on.
        on: u8,
    },
    /// Its up-conversion read the queue, did not fail, and is about to
    /// write its mark (conditioned on its own entry only).
    Marking {
        /// The resource.
        resource: u8,
    },
    /// Its up-conversion's mark is written; the read after it, which
    /// decides, is still to come.
    Marked {
        /// The resource.
        resource: u8,
    },
    /// Its up-conversion waits on one other entry: asleep until that entry
    /// is gone or no longer blocks it.
    Converting {
        /// The resource.
        resource: u8,
        /// The one entry it waits on.
        on: u8,
    },
    /// Its up-conversion gave up (a deadlock, or a try that would wait) on
    /// a read after its mark; taking the mark back is still to come.
    GivingUp {
        /// The resource.
        resource: u8,
    },
    /// Its up-conversion found nothing blocking it on a read after its mark
    /// (under [`Rule::GrantBeforeMark`](crate::Rule::GrantBeforeMark), on
    /// the read before it), and is about to write the grant, conditioned on
    /// every entry of that read being at the version read
    /// ([`Client::read`]).
    Granting {
        /// The resource.
        resource: u8,
    },
    /// Its release read the queue and decided whom to hand the lock over
    /// to ([`Client::hand_to`]); the write, conditioned on the entries of
    /// that read ([`Client::release`]), is still to come.
    Releasing {
        /// The resource.
        resource: u8,
    },
    /// Its `try_` request read the queue and would wait; removing its
    /// entry is still to come.
    Withdrawing {
        /// The resource.
        resource: u8,
        /// Its own entry.
        entry: u8,
    },
    /// Its script ran to the end, or it learnt that its session was lost.
    Done,
}

impl Phase {
    /// The `(resource, entry)` the client waits on, if it waits.
    pub fn waits_on(self) -> Option<(u8, u8)> {
        match self {
            Phase::Waiting { resource, on, .. } | Phase::Converting { resource, on } => Some((resource, on)),
            _ => None,
        }
    }
}

/// One client with its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// The index of its next step.
    pub pc: u8,
    /// What it is doing.
    pub phase: Phase,
    /// Whether its session is live. Once expired, the server has deleted its
    /// entries, but the client believes what it believed until it learns.
    pub live: bool,
    /// What it believes it holds, per resource.
    pub held: Vec<Option<Held>>,
    /// ([`Phase::Granting`] only) the entries of the read its write is
    /// conditioned on, `(id, version)`.
    pub read: Vec<(u8, u8)>,
    /// ([`Phase::Releasing`] only) the entries the hand-over's write is
    /// conditioned on, as read: its own entry first, then every entry up to
    /// the last one it grants.
    pub release: Vec<Entry>,
    /// ([`Phase::Releasing`] only) the waiting requests its release grants,
    /// in queue order.
    pub hand_to: Vec<u8>,
    /// ([`Phase::Releasing`], [`Rule::HandOverTokenAtRead`](crate::Rule::HandOverTokenAtRead)
    /// only) the revision its release read.
    pub read_revision: u8,
    /// ([`Phase::Granting`] only) the read its pending grant decided from
    /// showed the value block naming an entry that is gone: a grant outside
    /// PW and EX clears that name (`Block::cleared_if_lost`), whatever the
    /// block has become by the write.
    pub clears_block: bool,
}

/// A wake-up notification on its way to a client: the entry it watched was
/// removed or changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wake {
    /// The client told.
    pub client: u8,
    /// The resource.
    pub resource: u8,
    /// The entry removed or changed.
    pub entry: u8,
}

/// An append request on its way to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Append {
    /// The client sending it.
    pub client: u8,
    /// The resource.
    pub resource: u8,
    /// The attempt (the index of the client's `Lock` step).
    pub attempt: u8,
    /// The mode asked for.
    pub mode: Mode,
}

/// How many more faults may happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Session expiries.
    pub expiries: u8,
    /// Duplicated wake-ups.
    pub duplicate_wakes: u8,
    /// Retried appends.
    pub append_retries: u8,
}

/// Facts about the past that the properties read (history variables). Each
/// only ever turns true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// A request or conversion was granted while an earlier incompatible
    /// request or conversion still waited.
    pub bypass: bool,
    /// A removal or change woke a client that did not wait on that entry,
    /// or that the entry, changed, still blocks.
    pub herd: bool,
    /// A client whose session had expired got a write accepted after a write
    /// of a newer grant.
    pub stale_write_accepted: bool,
    /// The fence refused a write of a client whose session was live.
    pub live_write_refused: bool,
    /// The fence refused a write of a client whose session had expired.
    pub stale_write_refused: bool,
    /// An up-conversion was granted.
    pub converted: bool,
    /// A conversion deadlock was detected (and a conversion failed).
    pub deadlock_detected: bool,
    /// A conversion deadlock was detected on a read after the mark (not on
    /// the read before it).
    pub deadlock_after_mark: bool,
    /// A conversion failed with a deadlock while it lay on no cycle its own
    /// mark closed (one whose other conversions were all marked before it).
    pub false_deadlock: bool,
    /// A wake-up arrived for an entry its client no longer waited on (late or
    /// duplicated) and was ignored.
    pub stale_wake_ignored: bool,
    /// A removal that was no session's loss (a release, a cancel, a try
    /// withdrawn) left the value block naming the entry removed: the block
    /// looks lost by its holder.
    pub block_falsely_lost: bool,
    /// A waiter learnt from its read that a release had handed it the lock.
    pub handed_over: bool,
    /// A hand-over's write found an entry of its read changed, and released
    /// only.
    pub hand_over_fell_back: bool,
    /// A waiter granted by a hand-over was cancelled before it learnt so.
    pub handed_over_cancelled: bool,
    /// A grant, or an up-conversion to a writing mode, took a token below
    /// one an entry of the queue already held.
    pub token_fell: bool,
}

/// The whole state of one run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The server's resources.
    pub resources: Vec<Resource>,
    /// The clients.
    pub clients: Vec<Client>,
    /// Wake-ups in flight, sorted (a multiset).
    pub wakes: Vec<Wake>,
    /// Appends in flight, sorted (a multiset).
    pub appends: Vec<Append>,
    /// Faults left.
    pub budget: Budget,
    /// History variables.
    pub ghost: Ghost,
}

impl State {
    /// Whether every client has ended.
    pub fn all_done(&self) -> bool {
        self.clients.iter().all(|c| c.phase == Phase::Done)
    }
}
