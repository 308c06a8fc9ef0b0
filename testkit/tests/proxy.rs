//! The TCP proxy forwards both ways, cuts connections when blocked, and lets
//! them through again when unblocked.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use lockline_testkit::TcpProxy;

fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 64];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

fn round_trip(stream: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
    stream.write_all(text)?;
    let mut buf = vec![0u8; text.len()];
    stream.read_exact(&mut buf)?;
    Ok(buf)
}

#[test]
fn forwards_blocks_and_unblocks() {
    let proxy = TcpProxy::start(&echo_server()).expect("proxy");
    let mut stream = TcpStream::connect(proxy.address()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    assert_eq!(round_trip(&mut stream, b"hello").expect("echo"), b"hello");
    proxy.block();
    assert!(
        round_trip(&mut stream, b"cut").is_err(),
        "a blocked proxy kept the connection"
    );
    if let Ok(mut fresh) = TcpStream::connect(proxy.address()) {
        fresh.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        assert!(
            round_trip(&mut fresh, b"refused").is_err(),
            "a blocked proxy let a connection through"
        );
    }
    proxy.unblock();
    let mut again = TcpStream::connect(proxy.address()).expect("connect");
    again.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    assert_eq!(round_trip(&mut again, b"back").expect("echo"), b"back");
}

#[test]
fn blackhole_is_silent_and_heal_delivers() {
    let proxy = TcpProxy::start(&echo_server()).expect("proxy");
    let mut stream = TcpStream::connect(proxy.address()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert_eq!(round_trip(&mut stream, b"hello").expect("echo"), b"hello");
    proxy.blackhole();
    assert!(proxy.is_blackholed());
    stream
        .write_all(b"lost?")
        .expect("a blackhole does not reset the connection");
    let mut buf = [0u8; 5];
    let silent = stream.read(&mut buf);
    assert!(
        matches!(&silent, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "a blackholed proxy answered or closed: {silent:?}"
    );
    proxy.heal();
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    stream.read_exact(&mut buf).expect("delivered after heal");
    assert_eq!(&buf, b"lost?");
}

#[test]
fn held_requests_are_delivered_in_order_when_released() {
    let proxy = TcpProxy::start(&echo_server()).expect("proxy");
    let mut stream = TcpStream::connect(proxy.address()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    proxy.set_requests_held(true);
    stream.write_all(b"one").expect("write");
    stream.write_all(b"two").expect("write");
    let mut buf = [0u8; 6];
    assert!(stream.read(&mut buf).is_err(), "a held request reached the server");
    proxy.set_requests_held(false);
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    stream.read_exact(&mut buf).expect("released");
    assert_eq!(&buf, b"onetwo");
}

/// Waits (bounded) until `condition` holds; the proxy's threads give no event.
fn until(condition: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn orphaned_requests_reach_the_server_after_their_connection_died() {
    let proxy = TcpProxy::start(&echo_server()).expect("proxy");
    let mut stream = TcpStream::connect(proxy.address()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    assert_eq!(round_trip(&mut stream, b"hello").expect("echo"), b"hello");
    proxy.set_requests_held(true);
    stream.write_all(b"late").expect("write");
    assert!(until(|| proxy.held_request_bytes() == 4), "the request was not held");
    proxy.orphan_connections();
    let mut buf = [0u8; 8];
    assert!(
        matches!(stream.read(&mut buf), Ok(0) | Err(_)),
        "the client's end of an orphaned connection stayed open"
    );
    // New connections are not held by the orphans' switch.
    proxy.set_requests_held(false);
    let mut fresh = TcpStream::connect(proxy.address()).expect("connect");
    fresh.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    assert_eq!(round_trip(&mut fresh, b"fresh").expect("echo"), b"fresh");
    assert_eq!(proxy.orphan_answer_bytes(), 0, "an orphan's request went through early");
    assert_eq!(proxy.held_request_bytes(), 4);
    proxy.deliver_orphans();
    assert!(
        until(|| proxy.orphan_answer_bytes() == 4),
        "the server did not answer the delivered request"
    );
    assert_eq!(proxy.held_request_bytes(), 0);
}
