//! Connections a client leaves hanging are closed (header and body
//! timeouts), shutdown has a deadline, and a second signal exits at once
//! (issue 49, item 3).

use super::client::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Connect and send `bytes`, then leave the connection as it is.
fn hang(s: &Server, bytes: &[u8]) -> TcpStream {
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(bytes).expect("send");
    c
}

/// Read until the server closes the connection; what it sent.
fn until_closed(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

const HALF_BODY: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":";

#[test]
fn slow_headers_idle_connections_and_slow_bodies_are_cut_off() {
    let s = Server::start(&["--header-timeout", "1", "--body-timeout", "1"]);
    let t = Instant::now();
    let mut half_line = hang(&s, b"GET /hea");
    let mut idle = hang(&s, b"");
    let mut half_body = hang(&s, HALF_BODY);
    until_closed(&mut half_line);
    until_closed(&mut idle);
    let reply = until_closed(&mut half_body);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"request_timeout\""), "{reply}");
    // Still serving.
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn shutdown_has_a_deadline_and_a_second_signal_exits_at_once() {
    // A request whose body never comes keeps the graceful shutdown
    // waiting only until --shutdown-timeout.
    let s = Server::start(&["--body-timeout", "60", "--shutdown-timeout", "1"]);
    let _c = hang(&s, HALF_BODY);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let (status, log) = s.stop();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(status.success(), "{status:?} {log:?}");

    // With a long deadline, the second signal ends it.
    let mut s = Server::start(&["--body-timeout", "60", "--shutdown-timeout", "60"]);
    let _c = hang(&s, HALF_BODY);
    std::thread::sleep(Duration::from_millis(200));
    s.signal(libc::SIGTERM);
    assert!(s.wait_exit(Duration::from_millis(500)).is_none(), "it did not wait");
    let t = Instant::now();
    s.signal(libc::SIGINT);
    let status = s
        .wait_exit(Duration::from_secs(5))
        .expect("exit after the second signal");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(status.code(), Some(130));
}
