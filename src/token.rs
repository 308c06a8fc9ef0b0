//! Fencing tokens.

use std::fmt;

/// A fencing token: a number that strictly increases from one holder of a lock
/// to the next.
///
/// Pass it along with every write to the resource the lock protects. A resource
/// that remembers the highest token it has accepted and rejects lower ones stays
/// safe even when a holder is paused (GC, swap, a stopped VM) past the moment its
/// lock was lost and then wakes up to write: the newer holder's token is higher.
///
/// On etcd the token is the create revision of the holder's key; on ZooKeeper it
/// is the `czxid` of the holder's znode (not the sequence suffix, which restarts
/// when the parent is recreated); on the memory backend it is the revision of the
/// in-process store. All three are monotonic across the whole cluster, not only
/// per lock.
///
/// ```
/// use lockline::FencingToken;
/// let older = FencingToken::new(7);
/// let newer = FencingToken::new(12);
/// assert!(newer > older);
/// assert_eq!(newer.get(), 12);
/// assert_eq!(newer.to_string(), "12");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token with the given value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The token's value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
