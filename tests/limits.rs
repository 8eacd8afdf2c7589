//! Connection-level limits against the real server, with raw sockets: a
//! slow-loris client (headers or body dribbled) is cut off, oversized
//! headers get 431, connections past `max_connections` are closed at once,
//! and through all of it the server keeps answering everyone else.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

fn server() -> Server {
    Server::with_config(
        "[server]\nheader_read_timeout_ms = 300\nbody_read_timeout_ms = 300\nmax_connections = 4\n\
         max_header_bytes = 8192\n[[models]]\nname = \"mlp\"\nbase_path = \"$ROOT/examples/models/mlp\"\n",
    )
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    stream
}

/// Reads until the server closes the connection (or 30 s pass); answers
/// what it sent.
fn read_to_close(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => {
                panic!("the server did not close the connection: {e}; so far: {}", String::from_utf8_lossy(&answer))
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

fn healthy(server: &Server) {
    let mut stream = connect(server.http);
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
    let answer = read_to_close(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn slow_loris_clients_are_cut_off_and_the_server_keeps_serving() {
    let server = server();
    // Headers that never end.
    let mut headers = connect(server.http);
    headers.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("write");
    // A body that never arrives.
    let mut body = connect(server.http);
    body.write_all(
        b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"instances\": [",
    )
    .expect("write");
    healthy(&server);
    let started = Instant::now();
    let cut = read_to_close(&mut headers);
    assert!(!cut.starts_with("HTTP/1.1 200"), "slow headers were answered: {cut}");
    let answer = read_to_close(&mut body);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("server.body_read_timeout_ms"), "{answer}");
    eprintln!("both slow clients cut off {:?} after the server was asked", started.elapsed());
    healthy(&server);
}

#[tokio::test]
async fn oversized_headers_get_431_and_connections_past_the_limit_are_closed() {
    let server = server();
    let mut big = connect(server.http);
    let header = "x".repeat(16 << 10);
    big.write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {header}\r\n\r\n").as_bytes()).expect("write");
    let answer = read_to_close(&mut big);
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", &answer[..answer.len().min(200)]);

    // Four keep-alive connections, each answered once (so each is surely
    // accepted), fill the limit; a fifth is closed unanswered.
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        let mut stream = connect(server.http);
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut buffer = [0u8; 1024];
        let n = stream.read(&mut buffer).expect("answer");
        assert!(buffer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buffer[..n]));
        held.push(stream);
    }
    let mut fifth = connect(server.http);
    let _ = fifth.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let answer = read_to_close(&mut fifth);
    assert!(answer.is_empty(), "a connection past the limit was answered: {answer}");
    // They close; there is room again. (gRPC has a budget of its own.)
    drop(held);
    eventually("room for a new connection", || {
        let mut stream = connect(server.http);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let answer = read_to_close(&mut stream);
        if answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(answer)
        }
    })
    .await;
    healthy(&server);
    server
        .predict_client()
        .await
        .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(1, 64)))]))
        .await
        .expect("gRPC unaffected");
    let metrics = server.metrics().await;
    assert!(metric_value(&metrics, r#"sluice_connections_refused_total{port="http"}"#) >= 1.0, "{metrics}");
}
