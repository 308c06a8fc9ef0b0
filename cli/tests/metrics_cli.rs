//! `lockline lock --metrics ADDR` serves lockline's metrics for Prometheus
//! at `http://ADDR/metrics` while it holds, with the lock's name as a label;
//! an address that cannot be listened on is refused with 123 before
//! anything is contacted.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;

use lockline_testkit::{free_port, EtcdCluster};
use support::{lockline, Running};

/// One scrape of `http://127.0.0.1:PORT/metrics`: its body.
fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics listener");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the one sample line that starts with `series`.
fn value(body: &str, series: &str) -> f64 {
    let line = body
        .lines()
        .find(|line| line.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in:\n{body}"));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {line:?}"))
}

#[test]
fn a_holder_serves_its_metrics_while_it_holds() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = ["--etcd".to_owned(), cluster.endpoints().join(",")];
    let port = free_port().expect("port");
    let mut command = lockline("lock", &server);
    command
        .args(["--metrics", &format!("127.0.0.1:{port}"), "metrics/held"])
        .args(["sh", "-c", "echo running; read line; exit 0"])
        .stdin(Stdio::piped());
    let mut holder = Running::spawn("holder", command);
    holder.holding();
    assert_eq!(holder.stdout_line(), "running");

    let body = scrape(port);
    let labels = r#"{backend="etcd",recipe="mutex",lock="metrics/held"}"#;
    assert_eq!(value(&body, &format!("lockline_grants_total{labels}")), 1.0, "{body}");
    assert_eq!(value(&body, &format!("lockline_held{labels}")), 1.0, "{body}");
    assert_eq!(
        value(&body, &format!("lockline_acquire_wait_seconds_count{labels}")),
        1.0,
        "{body}"
    );
    assert!(body.contains("# HELP lockline_grants_total"), "described: {body}");

    holder.close_stdin();
    assert_eq!(holder.exits().code(), Some(0));
}

#[test]
fn an_address_in_use_is_refused_before_anything_is_contacted() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address");
    // Nothing listens at the etcd endpoint: a contacted server would be 122.
    let closed = free_port().expect("port");
    let out = lockline("lock", &["--etcd".to_owned(), format!("http://127.0.0.1:{closed}")])
        .args(["--metrics", &addr.to_string(), "metrics/refused", "true"])
        .output()
        .expect("run lockline");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(123), "{stderr}");
    assert!(stderr.contains("--metrics"), "{stderr}");
    for bad in ["nowhere", "127.0.0.1", "127.0.0.1:99999"] {
        let out = lockline("lock", &["--etcd".to_owned(), format!("http://127.0.0.1:{closed}")])
            .args(["--metrics", bad, "metrics/refused", "true"])
            .output()
            .expect("run lockline");
        assert_eq!(out.status.code(), Some(123), "--metrics {bad}");
    }
}
