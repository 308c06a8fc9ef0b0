//! The names of the properties the checker holds the model to.
//!
//! `always` properties (invariants) and the `eventually` one are what the
//! sound rule must keep; `sometimes` properties show that the interesting
//! states are reachable at all, so that an invariant is not kept by a model
//! that never gets there.

/// 1 (`always`): no two live sessions believe they hold one resource in
/// incompatible modes (for a semaphore: no more holders than permits).
pub const EXCLUSION: &str = "exclusion: no incompatible grants among live sessions";
/// 2 (`always`): a client whose session expired never gets a write accepted
/// after a write of a newer grant.
pub const FENCED: &str = "fence: no stale write after a newer holder's";
/// 2b (`always`): the fence never refuses a write of a holder whose session
/// is live (tokens rise with the grants, not with the appends).
pub const LIVE_WRITES_ACCEPTED: &str = "fence: a live holder's write is accepted";
/// 3 (`always`): nothing is granted while an earlier incompatible request or
/// conversion still waits (an up-conversion is ahead of every later request).
pub const NO_BYPASS: &str = "FIFO: no grant past an earlier incompatible waiter";
/// 4 (`always`): no cycle of entries waiting on each other stands once
/// every conversion on it has made its read after its mark and sleeps (a
/// cycle closes only with a mark, and is broken on a read after some mark
/// on it; until then it may stand).
pub const DEADLOCK_DETECTED: &str = "no undetected conversion deadlock";
/// 4b (`always`): a conversion fails with a deadlock only on a cycle that
/// its own mark closed: on the read it decides from, it lies on a cycle
/// whose other conversions were all marked before it (on the read before
/// its mark, counting that mark as the latest). A conversion on a cycle
/// closed by a later mark could be granted once that one gives up.
pub const NO_FALSE_DEADLOCK: &str = "no false deadlock: a conversion fails only on a cycle its mark closed";
/// 5 (`always`): once every client has ended, every queue is empty.
pub const NO_ENTRY_LEFT: &str = "no entry left once every client ends";
/// 5b (`always`): an entry is marked converting only while its owner's
/// conversion runs (after the mark, before the grant or the take-back).
pub const NO_STRAY_MARK: &str = "no mark left behind by a conversion";
/// 6 (`always`): a removal or change wakes only the clients that waited on
/// that very entry and that it lets on (gone, or no longer blocking them).
pub const HERD_FREE: &str = "herd-free: a change wakes only the waiters it lets on";
/// 7 (`always`): a waiter whose entry is no longer blocked by the entry it
/// waits on has a wake-up on its way.
pub const NO_LOST_WAKEUP: &str = "no lost wake-up";
/// 9 (`always`): the lock value block names an entry that is gone only
/// when that entry's session expired: a release, a cancel or a withdrawn
/// `try_` request clears the name as it removes the entry, so the block
/// never looks lost by a holder that left of its own accord.
pub const BLOCK_LOST_ONLY_BY_LOSS: &str = "value block: only a lost session leaves it naming a departed holder";
/// 9b (`always`): the value block names every PW or EX entry granted in
/// the queue: a holder lost with its session is then seen lost, and a
/// grant that did not see it never clears its name (nor overwrites what
/// it wrote).
pub const BLOCK_NAMES_WRITER: &str = "value block: names the PW or EX holder";
/// 2c (`always`): a grant in CW, PW or EX, and an up-conversion to one of
/// them, takes a token no lower than any an entry of the queue holds (one
/// hand-over gives its grants one token): a writer's token rises above
/// those granted before it in the server's order, whoever read the queue
/// when. (Grants in the other modes may come out of creation order, as
/// two readers' do; their tokens fence no write.)
pub const TOKENS_RISE: &str = "fence: a grant's token is below no token held";
/// 8 (`eventually`): every client ends (no one waits for ever).
pub const ALL_END: &str = "every client ends";

/// `sometimes`: some client holds something.
pub const GRANTED: &str = "a grant";
/// `sometimes`: an up-conversion is granted.
pub const CONVERTED: &str = "an up-conversion granted";
/// `sometimes`: a conversion deadlock is detected.
pub const DEADLOCK_FOUND: &str = "a conversion deadlock detected";
/// `sometimes`: a conversion deadlock is detected on a read after the
/// conversion's mark (the read before it showed none).
pub const DEADLOCK_AFTER_MARK: &str = "a conversion deadlock detected after the mark";
/// `sometimes`: the fence refuses a write of a client whose session expired.
pub const STALE_WRITE_REFUSED: &str = "a stale holder's write refused";
/// `sometimes`: a client believes it holds after its session expired.
pub const STALE_HOLDER: &str = "a holder whose session expired";
/// `sometimes`: a waiter learns from its read that a release handed it the
/// lock.
pub const HANDED_OVER: &str = "a grant by hand-over learnt";
/// `sometimes`: a hand-over's write finds an entry of its read changed and
/// releases only.
pub const HAND_OVER_FELL_BACK: &str = "a hand-over fell back to the plain release";
/// `sometimes`: a waiter granted by a hand-over is cancelled before it
/// learns so.
pub const HANDED_OVER_CANCELLED: &str = "a waiter handed the lock cancelled";
/// `sometimes`: a late or duplicated wake-up reaches a client that no longer
/// waits on that entry, and is ignored.
pub const STALE_WAKE_IGNORED: &str = "a late or duplicated wake-up ignored";
