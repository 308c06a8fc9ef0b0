//! Sequencers: what a holder hands a resource so that it can tell whether
//! the holder still holds (Chubby's `GetSequencer`/`CheckSequencer`).

use std::fmt;
use std::str::FromStr;

use crate::{EntryKind, Error, FencingToken, Result};

/// The version written at the head of every sequencer's text form.
const PREFIX: &str = "lockline1";

/// What a sequencer's holder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// A mutex.
    Mutex,
    /// The read (shared) side of a read/write lock.
    Read,
    /// The write (exclusive) side of a read/write lock.
    Write,
    /// A permit of a semaphore of `permits` permits.
    Permit {
        /// How many holders the semaphore admits.
        permits: usize,
    },
    /// The leadership of an election.
    Leadership,
    /// A [`Resource`](crate::Resource) held in a lock mode (`lock-PW`).
    Lock(crate::LockMode),
}

impl Mode {
    /// Whether an entry of `kind` can be this mode's holder. A mutex and an
    /// election candidate are one layout on etcd (Go's), so either stands
    /// for the other.
    pub(crate) fn matches(self, kind: EntryKind) -> bool {
        match self {
            Mode::Mutex | Mode::Leadership => matches!(kind, EntryKind::Mutex | EntryKind::Election),
            Mode::Read => kind == EntryKind::Read,
            Mode::Write => kind == EntryKind::Write,
            Mode::Permit { .. } => kind == EntryKind::Semaphore,
            Mode::Lock(_) => kind == EntryKind::Dlm,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Mutex => f.write_str("mutex"),
            Mode::Read => f.write_str("read"),
            Mode::Write => f.write_str("write"),
            Mode::Permit { permits } => write!(f, "permit-{permits}"),
            Mode::Leadership => f.write_str("leader"),
            Mode::Lock(mode) => write!(f, "lock-{mode}"),
        }
    }
}

/// A holder's proof of what it holds: the lock's name, the mode it holds it
/// in and its fencing token, for a resource that cannot keep the highest
/// token it has seen but can ask whether a holder is still current
/// ([`Client::check`](crate::Client::check), `lockline check`). Chubby calls
/// it a sequencer.
///
/// Its text form (`Display`, `FromStr`) is one line of visible ASCII, safe in
/// an HTTP header or an environment variable, and versioned:
/// `lockline1:MODE:TOKEN:NAME`, with MODE one of `mutex`, `read`, `write`,
/// `permit-N` (a semaphore of N permits), `leader`, `lock-M` (a
/// [`Resource`](crate::Resource) held in lock mode M, `NL` … `EX`); TOKEN in decimal; NAME
/// the lock's name with every byte outside `A-Z a-z 0-9 - . _ ~ /`
/// percent-encoded (`%3A` for `:`, UTF-8 bytes for other characters).
///
/// A `permit-N` sequencer is checked with the N it names: the number of
/// permits is not stored on the server, so a resource compares N with the
/// semaphore's size it knows.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::Sequencer;
///
/// let client = lockline::Client::memory();
/// let session = client.session().await?;
/// let guard = session.mutex("billing/run 1")?.lock().await?;
/// let sequencer = guard.sequencer();
/// let text = sequencer.to_string(); // "lockline1:mutex:2:billing/run%201"
/// assert_eq!(text.parse::<Sequencer>()?, sequencer);
/// assert!(client.check(&sequencer).await?);
/// guard.release().await?;
/// assert!(!client.check(&sequencer).await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sequencer {
    name: String,
    mode: Mode,
    token: FencingToken,
}

impl Sequencer {
    /// A sequencer for the holder of `name` in `mode` with `token`.
    pub fn new(name: impl Into<String>, mode: Mode, token: FencingToken) -> Self {
        Sequencer {
            name: name.into(),
            mode,
            token,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it holds.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Its fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

/// Digits only, at least one: what `str::parse` takes besides (a `+`) is
/// not the text form's.
fn decimal(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn keeps(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/')
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}:{}:{}:", self.mode, self.token.get())?;
        for &byte in self.name.as_bytes() {
            if keeps(byte) {
                write!(f, "{}", byte as char)?;
            } else {
                write!(f, "%{byte:02X}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Sequencer {
    type Err = Error;

    /// Parses the text form (see [`Sequencer`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming what is wrong: another version, an
    /// unknown mode, a token that is no number, a name badly encoded or empty.
    fn from_str(text: &str) -> Result<Self> {
        let invalid = |why: String| Error::InvalidOptions {
            reason: format!("not a lockline sequencer ({why}): {text:?}"),
        };
        let mut parts = text.splitn(4, ':');
        let (Some(version), Some(mode), Some(token), Some(name)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("expected lockline1:MODE:TOKEN:NAME".into()));
        };
        if version != PREFIX {
            return Err(invalid(format!("version {version:?}; this lockline reads {PREFIX}")));
        }
        let mode = match mode {
            "mutex" => Mode::Mutex,
            "read" => Mode::Read,
            "write" => Mode::Write,
            "leader" => Mode::Leadership,
            other if other.starts_with("lock-") => match other["lock-".len()..].parse::<crate::LockMode>() {
                Ok(mode) if other["lock-".len()..] == *mode.label() => Mode::Lock(mode),
                _ => return Err(invalid(format!("unknown mode {other:?}"))),
            },
            other => match other
                .strip_prefix("permit-")
                .filter(|n| decimal(n))
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(permits) if permits > 0 => Mode::Permit { permits },
                _ => return Err(invalid(format!("unknown mode {other:?}"))),
            },
        };
        let token: u64 = Some(token)
            .filter(|t| decimal(t))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| invalid(format!("token {token:?} is not a number")))?;
        let mut bytes = Vec::with_capacity(name.len());
        let mut rest = name.as_bytes();
        while let Some((&byte, tail)) = rest.split_first() {
            if byte == b'%' {
                let hex = tail
                    .get(..2)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| invalid("a % not followed by two hex digits".into()))?;
                bytes.push(hex);
                rest = &tail[2..];
            } else if keeps(byte) {
                bytes.push(byte);
                rest = tail;
            } else {
                return Err(invalid(format!("{:?} in the name is not encoded", byte as char)));
            }
        }
        let name = String::from_utf8(bytes).map_err(|_| invalid("the name is not UTF-8".into()))?;
        if name.is_empty() {
            return Err(invalid("the name is empty".into()));
        }
        Ok(Sequencer {
            name,
            mode,
            token: FencingToken::new(token),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_round_trips_and_is_header_safe() {
        let names = [
            "a",
            "jobs/nightly",
            "/locks/billing/",
            "with space",
            "ünï:cøde%",
            "a%20b",
        ];
        let modes = [
            Mode::Mutex,
            Mode::Read,
            Mode::Write,
            Mode::Permit { permits: 3 },
            Mode::Leadership,
        ];
        for name in names {
            for mode in modes {
                let sequencer = Sequencer::new(name, mode, FencingToken::new(1_795_637_853_781_247));
                let text = sequencer.to_string();
                assert!(
                    text.bytes().all(|b| b.is_ascii_graphic()),
                    "{text:?} is not visible ASCII"
                );
                assert_eq!(text.parse::<Sequencer>().expect("parse"), sequencer, "{text}");
            }
        }
        assert_eq!(
            Sequencer::new("billing/run 1", Mode::Mutex, FencingToken::new(7)).to_string(),
            "lockline1:mutex:7:billing/run%201"
        );
        assert_eq!(
            Sequencer::new("q", Mode::Permit { permits: 2 }, FencingToken::new(9)).to_string(),
            "lockline1:permit-2:9:q"
        );
    }

    #[test]
    fn bad_text_is_refused_with_the_reason() {
        for (text, why) in [
            ("lockline2:mutex:1:a", "version"),
            ("lockline1:mutex:1", "expected"),
            ("lockline1:latch:1:a", "mode"),
            ("lockline1:permit-0:1:a", "mode"),
            ("lockline1:mutex:x:a", "token"),
            ("lockline1:mutex:1:", "empty"),
            ("lockline1:mutex:1:a%2", "hex"),
            ("lockline1:mutex:1:a b", "encoded"),
            ("lockline1:mutex:1:%FF", "UTF-8"),
            ("lockline1:mutex:1:%+1", "hex"),
            ("lockline1:mutex:+5:a", "token"),
            ("lockline1:mutex::a", "token"),
            ("lockline1:permit-+2:1:a", "mode"),
        ] {
            match text.parse::<Sequencer>() {
                Err(Error::InvalidOptions { reason }) => assert!(reason.contains(why), "{text}: {reason}"),
                other => panic!("{text} must be refused, got {other:?}"),
            }
        }
    }
}
