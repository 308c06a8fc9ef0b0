//! Passwords are never shown. The secrets a command line and its
//! environment hold, in every form a message might show them, for
//! [`output::hide`](crate::output::hide); the passwords a URL may hold; and
//! a URL's scheme, all of it a message or `Debug` may show.

/// The scheme of `url` (what comes before `://`), when it looks like one: a
/// letter, then letters, digits, `+`, `-` or `.`. Anything else is not
/// shown, since it may be part of a password.
pub(crate) fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && scheme.len() <= 32;
    valid.then_some(scheme)
}

/// The passwords a database or Redis URL may hold, as written and
/// percent-decoded: the user information's (`USER:PASSWORD@`, for a password
/// written with an unencoded `/`, `?` or `@` too) and `password=` query
/// parameters'. A candidate too many is harmless: it is only hidden.
pub(crate) fn url_secrets(url: &str) -> Vec<String> {
    let Some((_, rest)) = url.split_once("://") else {
        // Not a URL: nothing is connected, and nothing can tell where a
        // password would be; hide it all.
        return vec![url.to_owned()];
    };
    let mut secrets = Vec::new();
    for at in [rest.find('@'), rest.rfind('@')].into_iter().flatten() {
        if let Some((_, password)) = rest[..at].split_once(':') {
            secrets.push(password.to_owned());
        }
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split('&') {
            if let Some((name, value)) = pair.split_once('=') {
                if name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("pass") {
                    secrets.push(value.to_owned());
                }
            }
        }
    }
    let decoded: Vec<String> = secrets.iter().filter_map(|s| percent_decoded(s)).collect();
    secrets.extend(decoded);
    secrets.sort();
    secrets.dedup();
    secrets
}

/// `text` with its `%XX` escapes decoded, when that changes it and gives
/// UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let hex = |at: usize| bytes.get(at).and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let (b'%', Some(high), Some(low)) = (bytes[i], hex(i + 1), hex(i + 2)) {
            out.push(u8::try_from(high * 16 + low).unwrap_or(b'%'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).ok()?;
    (decoded != text).then_some(decoded)
}

/// The secrets written on the command line or in the environment,
/// wherever they ended up: the password of `--user NAME:PASSWORD`, of
/// `--password PASSWORD` and of `--zk-auth SCHEME:USER:PASSWORD` (all of a
/// `--zk-auth` value without a password field), in either form (`--flag
/// value`, `--flag=value`), also inside another argument (`--zk-acl=--password=PW`
/// makes the secret option another flag's value, and a message about that
/// value must not show it); the same from `ETCDCTL_USER`,
/// `ETCDCTL_PASSWORD` and `LOCKLINE_ZK_AUTH`; and the password of any URL
/// in an argument or in `DATABASE_URL` (user info, `password=` or `pass=`
/// in the query). A word that is itself an option (`--password --`) is not
/// taken for a password.
pub(crate) fn written_secrets(argv: &[String], env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    fn password_of(flag: &str, value: &str) -> Option<String> {
        let secret = match flag {
            "--password" => Some(value),
            "--user" => value.split_once(':').map(|(_, password)| password),
            "--zk-auth" => Some(value.splitn(3, ':').nth(2).unwrap_or(value)),
            _ => None,
        }?;
        (!secret.is_empty() && !secret.starts_with("--")).then(|| secret.to_owned())
    }
    let mut secrets = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        for flag in ["--password", "--user", "--zk-auth"] {
            if arg == flag {
                if let Some(value) = argv.get(i + 1) {
                    secrets.extend(password_of(flag, value));
                }
            }
            let written = format!("{flag}=");
            if let Some(at) = arg.find(&written) {
                secrets.extend(password_of(flag, &arg[at + written.len()..]));
            }
        }
        if let Some(at) = arg.find("://") {
            let start = arg[..at].rfind('=').map_or(0, |equals| equals + 1);
            secrets.extend(url_secrets(&arg[start..]));
        }
    }
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    secrets.extend(env("ETCDCTL_PASSWORD"));
    secrets.extend(env("ETCDCTL_USER").and_then(|user| password_of("--user", &user)));
    secrets.extend(env("LOCKLINE_ZK_AUTH").and_then(|auth| password_of("--zk-auth", &auth)));
    secrets.extend(env("DATABASE_URL").map(|url| url_secrets(&url)).into_iter().flatten());
    secrets
}

#[cfg(test)]
mod tests {
    use crate::args::tests::args;

    #[test]
    fn never_shows_a_password() {
        let parsed = args("lock --etcd https://a:1 --cacert ca --user alice:SECRET-1 x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("alice") && !shown.contains("SECRET-1"), "{shown}");
        let parsed = args("lock --zookeeper h:1 --zk-auth digest:bob:SECRET-2 x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("bob") && !shown.contains("SECRET-2"), "{shown}");
        for line in [
            "lock --zookeeper h:1 --zk-auth bogus:bob:SECRET-3 x",
            "lock --zookeeper h:1 --user bob:SECRET-3 x",
            "lock --etcd h:1 --password SECRET-3 x",
        ] {
            let error = args(line).expect_err("refused");
            assert!(!error.contains("SECRET-3"), "{line}: {error}");
        }
    }

    #[test]
    fn never_shows_a_database_password() {
        let parsed = args("lock --postgres postgres://app:SECRET-6@db/app x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("postgres://") && !shown.contains("SECRET-6"), "{shown}");
        let parsed = args("lock --redis redis://:SECRET-6@r:6379 x").expect("parse");
        assert!(!format!("{parsed:?}").contains("SECRET-6"));
        let hidden = super::url_secrets;
        assert_eq!(hidden("postgres://app:s3cret@db/app"), ["s3cret"]);
        assert_eq!(hidden("postgres://app:s%40c@db/app"), ["s%40c", "s@c"]);
        // Unencoded '/' and '@' in a password, a password in the query.
        assert!(hidden("postgres://app:pa/ss@db/app").contains(&"pa/ss".to_owned()));
        assert!(hidden("mysql://app:p@ss@db/app").contains(&"p@ss".to_owned()));
        assert_eq!(
            hidden("postgres://app@db?password=q%2Fw&sslmode=require"),
            ["q%2Fw", "q/w"]
        );
        assert!(hidden("postgres://db/app").is_empty());
        let parsed = args("lock --etcd http://e:1 --user alice:pw-1 x").expect("parse");
        assert_eq!(parsed.secrets(), ["pw-1"]);
    }
}
