//! The state an entry's value carries, and the wake rule that reads it.

use std::cell::Cell;

use super::*;

/// One entry's state, as its value holds it: `dlm2 <granted|-> <requested>
/// <token> <blocked> <since> <conv> <nonce>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    /// The mode held, or `None` for a request still waiting.
    pub(crate) granted: Option<LockMode>,
    /// The mode asked for: the granted mode when settled, the new mode while
    /// converting, the request's mode while waiting.
    pub(crate) requested: LockMode,
    /// The grant's fencing token; 0: the token is the write that set this
    /// state (its [`Slot::changed`]).
    pub(crate) token: u64,
    /// The modes waiters blocked by this entry asked for (bits of
    /// [`LockMode::bit`]).
    pub(crate) blocked: u8,
    /// While converting: when the conversion was marked, in the server's
    /// order of writes (0 when written: that write's [`Slot::changed`]).
    /// Of the conversions on a cycle, the one marked last gives up.
    pub(crate) since: u64,
    /// While converting: the conversion's id, so that taking back a
    /// cancelled conversion never takes back a later one (odd; even for a
    /// `try_convert`). On a waiting request: 0, or [`TRY_REQUEST`] for a
    /// `try_` request's (see [`State::never_waits`]).
    pub(crate) conv: u32,
}

pub(crate) const STATE_HEAD: &str = "dlm2";

/// The `conv` of a `try_` request's waiting entry: it never waits (see
/// [`State::never_waits`]).
pub(crate) const TRY_REQUEST: u32 = 2;

/// A bit of [`State::blocked`] beside the modes' bits: the entry's holder
/// listens for blocking notifications (its resource was made with
/// [`Resource::notify_blocking`](crate::Resource::notify_blocking)). Waiters mark only entries that carry it,
/// so a resource whose holders do not listen pays no write for them.
pub(crate) const LISTENING: u8 = 1 << 6;

/// A bit of [`State::blocked`] on a waiting request: it waits to be granted
/// (not a `try_` request, which reads once and leaves), so a releaser whose
/// departure lets it in may grant it in the release's own write (see
/// [`View::handed_over`]).
pub(crate) const WAITS: u8 = 1 << 7;

impl State {
    pub(crate) fn waiting(mode: LockMode) -> State {
        State {
            granted: None,
            requested: mode,
            token: 0,
            blocked: 0,
            since: 0,
            conv: 0,
        }
    }

    pub(crate) fn held(mode: LockMode, token: u64) -> State {
        State {
            granted: Some(mode),
            requested: mode,
            token,
            blocked: 0,
            since: 0,
            conv: 0,
        }
    }

    pub(crate) fn converting(self) -> Option<LockMode> {
        self.granted.filter(|&g| g != self.requested).map(|_| self.requested)
    }

    /// Whether the entry never waits: a `try_` request's entry (a `conv`
    /// other than 0, where a request that waits has 0) or a `try_convert`'s
    /// mark (an even `conv`, where a conversion that waits has an odd one).
    /// It leaves, or gives up, where it would wait: no deadlock goes
    /// through it, though it blocks others for as long as it stands.
    pub(crate) fn never_waits(self) -> bool {
        match self.granted {
            None => self.conv != 0,
            Some(_) => self.converting().is_some() && self.conv != 0 && self.conv.is_multiple_of(2),
        }
    }

    /// The `conv` of an up-conversion's mark: odd for one that waits, even
    /// for a `try_convert` (see [`State::never_waits`]); never 0.
    pub(crate) fn conversion_id(waits: bool) -> u32 {
        let nonce = rand_nonce();
        if waits {
            nonce | 1
        } else {
            (nonce | 2) & !1
        }
    }

    /// The value bytes; a fresh nonce makes every write differ from every
    /// earlier one, so a watcher never misses a change that came back.
    pub(crate) fn encode(self) -> Vec<u8> {
        let granted = self.granted.map_or("-", LockMode::label);
        let mut out = Vec::with_capacity(64);
        for word in [STATE_HEAD, granted, self.requested.label()] {
            out.extend_from_slice(word.as_bytes());
            out.push(b' ');
        }
        for number in [self.token, u64::from(self.blocked), self.since, u64::from(self.conv)] {
            push_decimal(&mut out, number);
            out.push(b' ');
        }
        push_hex8(&mut out, rand_nonce());
        out
    }

    /// Reads a value; one lockline did not write counts as a waiting EX
    /// request (it blocks everyone behind it, and nobody waits for it to be
    /// granted).
    pub(crate) fn decode(value: &[u8], changed: u64) -> State {
        Self::parse(value, changed).unwrap_or(State::waiting(LockMode::Ex))
    }

    pub(crate) fn parse(value: &[u8], changed: u64) -> Option<State> {
        // Every decision reads each entry of the queue it decides from, so
        // this is read by hand, byte by byte, without `str::split` and
        // `str::parse` (several times the work); it takes exactly what they
        // took (`parse_state_reads_what_str_parse_read` below).
        std::str::from_utf8(value).ok()?;
        let mut words = value.split(|&b| b == b' ');
        if words.next()? != STATE_HEAD.as_bytes() {
            return None;
        }
        let granted = match words.next()? {
            b"-" => None,
            mode => Some(mode_of(mode)?),
        };
        let requested = mode_of(words.next()?)?;
        let token = match decimal(words.next()?)? {
            0 if granted.is_some() => changed,
            token => token,
        };
        let blocked = u8::try_from(decimal(words.next()?)?).ok()?;
        let converting = granted.is_some_and(|g| g != requested);
        let since = match decimal(words.next()?)? {
            0 if converting => changed,
            since => since,
        };
        let conv = u32::try_from(decimal(words.next()?)?).ok()?;
        Some(State {
            granted,
            requested,
            token,
            blocked,
            since,
            conv,
        })
    }
}

/// A mode's label, in any case, as `LockMode::from_str` takes it.
fn mode_of(word: &[u8]) -> Option<LockMode> {
    LockMode::ALL
        .into_iter()
        .find(|m| m.label().as_bytes().eq_ignore_ascii_case(word))
}

/// An unsigned decimal as `u64::from_str` takes it: digits, after an
/// optional `+`; `None` when empty, for any other byte, or past `u64::MAX`.
pub(crate) fn decimal(word: &[u8]) -> Option<u64> {
    digits(word.strip_prefix(b"+").unwrap_or(word))
}

/// A signed decimal as `i64::from_str` takes it: digits, after an optional
/// `+` or `-`; `None` when empty, for any other byte, or out of range.
pub(crate) fn signed(word: &[u8]) -> Option<i64> {
    match word.strip_prefix(b"-") {
        Some(magnitude) => 0i64.checked_sub_unsigned(digits(magnitude)?),
        None => i64::try_from(decimal(word)?).ok(),
    }
}

/// Decimal digits alone, at least one, within `u64`.
fn digits(word: &[u8]) -> Option<u64> {
    if word.is_empty() {
        return None;
    }
    word.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Whether `value` is a state lockline wrote for a request never granted or
/// a lock held in the mode it asked for (not converting): see
/// [`crate::backend::only_owner_unblocks`].
pub(crate) fn state_settled_or_waiting(value: &[u8]) -> bool {
    State::parse(value, 0).is_some_and(|state| state.converting().is_none())
}

/// A random 32-bit number: a per-thread xorshift generator, seeded from the
/// system's random source once per thread (a system call per write would
/// cost more than the rest of the encoding).
pub(crate) fn rand_nonce() -> u32 {
    thread_local! {
        static NEXT: Cell<u64> = Cell::new({
            let bytes = *uuid::Uuid::new_v4().as_bytes();
            // Never 0, which xorshift never leaves.
            u64::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7]]) | 1
        });
    }
    NEXT.with(|next| {
        let mut x = next.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        next.set(x);
        (x >> 32) as u32
    })
}

/// Appends `n` in decimal, as `format!("{n}")` would.
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends `n` as eight lowercase hexadecimal digits, as `format!("{n:08x}")`
/// would.
fn push_hex8(out: &mut Vec<u8>, n: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..8).rev() {
        out.push(HEX[((n >> (shift * 4)) & 0xf) as usize]);
    }
}

/// Whether an entry in state `other` keeps `me` waiting, as
/// [`View::blockers`] counts it (`other` earlier than `me` when it is a
/// waiting request and `me` converts).
pub(crate) fn blocks(other: State, me: State) -> bool {
    match me.converting() {
        Some(target) => match other.granted {
            Some(held) => !held.compatible(target),
            None => !other.requested.compatible(target),
        },
        None => other.granted.is_some_and(|g| !g.compatible(me.requested)) || !other.requested.compatible(me.requested),
    }
}
