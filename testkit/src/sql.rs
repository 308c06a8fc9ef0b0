//! What the PostgreSQL and MariaDB servers share.

use std::io::{Error, Write};
use std::process::{Command, Output, Stdio};

use crate::Result;

/// How many locks of one kind a SQL server holds for its sessions and how many
/// sessions wait for one: PostgreSQL's advisory locks
/// ([`PgServer::advisory_locks`](crate::PgServer::advisory_locks)), MariaDB's
/// `GET_LOCK` locks
/// ([`MariaDbServer::user_locks`](crate::MariaDbServer::user_locks)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockCounts {
    /// Locks granted (a lock taken twice by one session counts once).
    pub held: u64,
    /// Sessions waiting for a lock.
    pub waiting: u64,
}

impl LockCounts {
    /// Parses one row `HELD<separator>WAITING`.
    pub(crate) fn parse(row: &str, separator: char) -> Result<Self> {
        let row = row.trim();
        let parsed = row.split_once(separator).and_then(|(held, waiting)| {
            Some(LockCounts {
                held: held.trim().parse().ok()?,
                waiting: waiting.trim().parse().ok()?,
            })
        });
        parsed.ok_or_else(|| Error::other(format!("unexpected lock counts {row:?}")))
    }
}

/// `value` between two `quote` characters, each one inside doubled: a
/// PostgreSQL identifier (`"`) or string (`'`), a MariaDB identifier (`` ` ``).
/// For a MariaDB string use [`mariadb_string`].
pub(crate) fn quote(value: &str, quote: char) -> String {
    let doubled: String = [quote, quote].iter().collect();
    format!("{quote}{}{quote}", value.replace(quote, &doubled))
}

/// `value` as a MariaDB string literal: backslashes are escapes there unless
/// `NO_BACKSLASH_ESCAPES` is set, so they are doubled too.
pub(crate) fn mariadb_string(value: &str) -> String {
    quote(&value.replace('\\', "\\\\"), '\'')
}

/// Runs `command` with `input` on its standard input.
pub(crate) fn run_with_input(mut command: Command, input: &str) -> Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::new(e.kind(), format!("cannot run {:?}: {e}", command.get_program())))?;
    if let Some(mut stdin) = child.stdin.take() {
        // Written from a thread: a long script must not block on a full pipe
        // while the program blocks on its full standard output.
        let input = input.to_owned();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let output = child.wait_with_output()?;
        // A program that exits before reading everything makes the write fail:
        // its exit status and standard error tell why.
        let _ = writer.join();
        return Ok(output);
    }
    child.wait_with_output()
}

/// Percent-encodes everything but unreserved characters, for a URL's user,
/// password or path.
pub(crate) fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_encoding() {
        assert_eq!(quote(r#"a"b"#, '"'), r#""a""b""#);
        assert_eq!(quote("it's", '\''), "'it''s'");
        assert_eq!(quote("a`b", '`'), "`a``b`");
        assert_eq!(mariadb_string(r"it's \n"), r"'it''s \\n'");
        assert_eq!(percent_encode("a b/c@d:é-_.~"), "a%20b%2Fc%40d%3A%C3%A9-_.~");
    }

    #[test]
    fn lock_counts_parse() {
        assert_eq!(
            LockCounts::parse("2|1\n", '|').expect("parse"),
            LockCounts { held: 2, waiting: 1 }
        );
        assert_eq!(LockCounts::parse("0\t0\n", '\t').expect("parse"), LockCounts::default());
        assert!(LockCounts::parse("", '|').is_err());
    }
}
