//! Lock names, checked once for every backend.

use crate::{Error, Result};

/// The longest name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// Checks a lock name against the rules every backend can store.
///
/// A name is a `/`-separated path such as `jobs/nightly` or `/locks/billing`:
/// at most [`MAX_NAME_LEN`] bytes, an optional leading `/` (kept: on etcd it is
/// part of the key prefix, as with `etcdctl lock /locks/billing`), an optional
/// trailing `/` (kept: etcd's Go examples name locks `/my-lock/`, whose keys are
/// `/my-lock//<lease>`; a backend that cannot store it, ZooKeeper, refuses it in
/// its own check), no empty, `.` or `..` segment, and no character ZooKeeper
/// refuses in a path (control characters, U+E000–U+F8FF, U+FFF0–U+FFFF).
pub(crate) fn validate(name: &str) -> Result<()> {
    let invalid = |reason: &str| {
        Err(Error::InvalidName {
            name: name.to_owned(),
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return invalid("the name is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid("the name is longer than 512 bytes");
    }
    if let Some(bad) = name.chars().find(|&c| forbidden_char(c)) {
        return Err(Error::InvalidName {
            name: name.to_owned(),
            reason: format!("the name contains the character {bad:?}, which ZooKeeper cannot store"),
        });
    }
    let body = name.strip_prefix('/').unwrap_or(name);
    let body = body.strip_suffix('/').unwrap_or(body);
    if body.is_empty() {
        return invalid("the name has no segment between its '/'s");
    }
    for segment in body.split('/') {
        match segment {
            "" => return invalid("the name has an empty segment ('//')"),
            "." | ".." => return invalid("the name has a '.' or '..' segment"),
            _ => {}
        }
    }
    Ok(())
}

fn forbidden_char(c: char) -> bool {
    c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::validate;

    #[test]
    fn accepts_plain_and_nested_names() {
        for name in [
            "a",
            "jobs/nightly",
            "/locks/billing",
            "with space",
            "ünïcode-ok_1.2",
            "/my-lock/",
            "a/",
        ] {
            assert!(validate(name).is_ok(), "{name:?} should be accepted");
        }
    }

    #[test]
    fn rejects_what_a_backend_cannot_store() {
        let long = "x".repeat(513);
        for name in [
            "",
            "/",
            "//",
            "a//",
            "/a//",
            "a//b",
            "a/./b",
            "../a",
            "nul\0",
            "tab\there",
            "\u{e000}",
            long.as_str(),
        ] {
            assert!(
                matches!(validate(name), Err(crate::Error::InvalidName { .. })),
                "{name:?} should be refused"
            );
        }
    }
}
