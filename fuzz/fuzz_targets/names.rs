//! Lock names as `Client::validate_name` checks them (the core's rules, the
//! ones every backend relies on before it builds a key from a name): never a
//! panic, `InvalidName` for a refused name, and what is accepted has none of
//! the shapes the backends' layouts cannot hold (empty, too long, control
//! characters, an empty, `.` or `..` segment).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lockline::{Client, Error, MAX_NAME_LEN};

fuzz_target!(|data: &[u8]| {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    let client = CLIENT.get_or_init(Client::memory);
    let name = String::from_utf8_lossy(data);
    match client.validate_name(&name) {
        Ok(()) => {
            assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN, "{name:?}");
            assert!(!name.chars().any(char::is_control), "{name:?}");
            let body = name.strip_prefix('/').unwrap_or(&name);
            let body = body.strip_suffix('/').unwrap_or(body);
            assert!(
                body.split('/').all(|s| !matches!(s, "" | "." | "..")),
                "{name:?} has an empty, . or .. segment"
            );
        }
        Err(Error::InvalidName { name: refused, .. }) => assert_eq!(refused, name),
        Err(other) => panic!("{name:?}: not InvalidName: {other:?}"),
    }
});
