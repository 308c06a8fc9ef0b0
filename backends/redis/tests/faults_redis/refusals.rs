//! Servers that cannot be used (nothing listening, silent, another
//! protocol, a wrong password) and bad input: typed errors within the
//! deadline, never a hang.

use super::*;

/// Unreachable servers fail within the connect timeout, with what failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_silent_servers_are_unavailable_within_the_deadline() {
    // Nothing listens.
    let port = free_port().expect("port");
    let started = Instant::now();
    let error = Client::new(Redis::new(format!("redis://127.0.0.1:{port}")))
        .session_with(options(2000))
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    // A port that accepts and never answers (a blackholed proxy).
    let server = RedisServer::start().expect("start redis");
    let (proxy, far) = through_a_proxy(&server);
    proxy.blackhole();
    let started = Instant::now();
    let error = far.session_with(options(2000)).await.expect_err("blackholed");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

/// A port that speaks another protocol (an HTTP-like listener that answers
/// garbage) is an error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_redis_port_is_an_error_within_the_deadline() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 512];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let started = Instant::now();
    let error = Client::new(Redis::new(format!("redis://127.0.0.1:{port}")))
        .session_with(options(2000))
        .await
        .expect_err("not Redis");
    assert!(
        matches!(error, Error::Unavailable { .. } | Error::Backend { .. }),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

/// A wrong password is refused as such, and the message holds no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_failure() {
    let server = RedisServer::start_with(&RedisOptions {
        password: Some("right-secret".into()),
        ..RedisOptions::default()
    })
    .expect("start redis");
    let url = format!("redis://:wrong-secret@127.0.0.1:{}", server.port());
    let error = Client::new(Redis::new(url))
        .session_with(options(2000))
        .await
        .expect_err("wrong password");
    assert!(matches!(error, Error::AuthenticationFailed { .. }), "{error:?}");
    assert!(!error.to_string().contains("wrong-secret"), "{error}");
    assert!(!format!("{error:?}").contains("wrong-secret"), "{error:?}");
    // The right one works.
    let session = Client::new(Redis::new(server.url()))
        .session_with(options(2000))
        .await
        .expect("right password");
    let guard = session.mutex("auth").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
}

/// Bad names, URLs and options are typed errors before anything connects;
/// a lock key that exists with another type is a typed error too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_typed_errors() {
    for url in [
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:99999",
        "127.0.0.1:6379",
        "redis://127.0.0.1:0",
    ] {
        match Client::new(Redis::new(url)).session_with(options(2000)).await {
            Err(Error::InvalidOptions { reason }) => assert!(reason.contains("Redis URL"), "{reason}"),
            other => panic!("{url} must be refused as invalid, got {other:?}"),
        }
    }
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options(2000)).await.expect("session");
    for name in ["a{b", "c}d", "{tag}"] {
        assert!(
            matches!(session.mutex(name), Err(Error::InvalidName { .. })),
            "{name} must be refused"
        );
    }
    let mut side = support::side(&server.url()).await;
    let _: () = side.set("{typed}:q", "a string").await.expect("set");
    match bounded(
        "lock over a key of another type",
        session.mutex("typed").expect("mutex").lock(),
    )
    .await
    {
        Err(Error::InvalidName { name, reason }) => {
            assert_eq!(name, "typed", "the error names the lock");
            assert!(reason.contains("another type"), "{reason}");
        }
        other => panic!("a queue key of another type must be a typed error, got {other:?}"),
    }
    // Its cleanup ends (found by review: it retried for the session's life).
    bounded("cleanup", session.flush()).await;
    assert!(matches!(
        Client::new(Redis::cluster(Vec::<String>::new()))
            .session_with(options(2000))
            .await,
        Err(Error::InvalidOptions { .. })
    ));
}
