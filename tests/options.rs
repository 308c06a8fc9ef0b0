//! Session options and names are checked before anything reaches a server.

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};

#[test]
fn ttl_bounds() {
    for ttl in [Duration::ZERO, Duration::from_millis(999), Duration::from_secs(86_401)] {
        assert!(
            matches!(
                SessionOptions::new().with_ttl(ttl).validate(),
                Err(Error::InvalidOptions { .. })
            ),
            "{ttl:?}"
        );
    }
    for ttl in [
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(86_400),
    ] {
        assert!(SessionOptions::new().with_ttl(ttl).validate().is_ok(), "{ttl:?}");
    }
}

#[test]
fn margins_and_timeouts() {
    let ttl = Duration::from_secs(4);
    let base = SessionOptions::new().with_ttl(ttl);
    assert!(base.clone().with_safety_margin(ttl).validate().is_err());
    assert!(base.clone().with_keepalive_interval(Duration::ZERO).validate().is_err());
    assert!(base
        .clone()
        .with_keepalive_interval(Duration::from_secs(4))
        .validate()
        .is_err());
    assert!(base.clone().with_connect_timeout(Duration::ZERO).validate().is_err());
    assert!(base
        .clone()
        .with_request_timeout(Duration::from_secs(90_000))
        .validate()
        .is_err());
    let tuned = base
        .with_safety_margin(Duration::from_secs(1))
        .with_keepalive_interval(Duration::from_millis(500));
    assert!(tuned.validate().is_ok());
    assert_eq!(tuned.loss_deadline(), Duration::from_secs(3));
}

#[test]
fn defaults() {
    let options = SessionOptions::default();
    assert_eq!(options.ttl(), Duration::from_secs(10));
    assert_eq!(options.safety_margin(), Duration::from_secs(2));
    assert!(options.keepalive_interval() < options.loss_deadline());
    assert!(options.validate().is_ok());
}

#[tokio::test]
async fn invalid_options_never_open_a_session() {
    let client = Client::memory();
    let result = client
        .session_with(SessionOptions::new().with_ttl(Duration::ZERO))
        .await;
    assert!(matches!(result, Err(Error::InvalidOptions { .. })));
    assert_eq!(client.stats().sessions, 0);
}

#[tokio::test]
async fn errors_name_what_happened() {
    let session = Client::memory().session().await.expect("session");
    let error = session.mutex("a//b").expect_err("refused");
    assert!(error.to_string().contains("a//b"), "{error}");
    assert!(!error.is_transient());
    let long = "n".repeat(lockline::MAX_NAME_LEN + 1);
    assert!(matches!(session.mutex(&long), Err(Error::InvalidName { .. })));
    assert!(session.mutex(&"n".repeat(lockline::MAX_NAME_LEN)).is_ok());
}

#[test]
fn session_states_only_move_forward() {
    use lockline::SessionState::{Closed, Live, Lost, Suspended};
    assert!(Live.may_become(Suspended) && Suspended.may_become(Live));
    assert!(Live.may_become(Lost) && Suspended.may_become(Closed));
    assert!(!Lost.may_become(Live) && !Closed.may_become(Lost) && !Lost.may_become(Suspended));
    assert!(!Suspended.may_become(Suspended) && !Live.may_become(Live));
    let (state, watch) = tokio::sync::watch::channel(Live);
    assert!(lockline::backend::advance(&state, Suspended));
    assert!(lockline::backend::advance(&state, Lost));
    assert!(!lockline::backend::advance(&state, Live));
    assert_eq!(*watch.borrow(), Lost);
}

/// A backend error's one line holds the client library's words and those of
/// its causes (a transport error's "connection refused"), each once, and
/// still keeps the error itself as `source()`.
#[test]
fn backend_errors_carry_their_cause_in_the_message() {
    #[derive(Debug)]
    struct Transport(std::io::Error);
    impl std::fmt::Display for Transport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }
    impl std::error::Error for Transport {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let refused = || {
        Transport(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ))
    };
    let error = Error::backend("etcd", refused());
    assert_eq!(error.to_string(), "etcd error: transport error: connection refused");
    assert!(std::error::Error::source(&error).is_some());
    let error = Error::unavailable_because("etcd", "cannot reach http://10.0.0.1:2379", refused());
    assert_eq!(
        error.to_string(),
        "etcd unavailable: cannot reach http://10.0.0.1:2379: transport error: connection refused"
    );
    assert!(error.is_transient());
}
