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
    // accepted), fill the limit; a fifth is closed unanswered. The client
    // reads the refused connection's close before the server's task for
    // it has let its place go, so a connection closed unanswered while
    // filling is tried again (the place frees within milliseconds).
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        let mut tries = 0;
        loop {
            let mut stream = connect(server.http);
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
            let mut buffer = [0u8; 1024];
            let n = stream.read(&mut buffer).unwrap_or(0);
            if n == 0 && tries < 100 {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            assert!(buffer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buffer[..n]));
            held.push(stream);
            break;
        }
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

/// One HTTP/2 frame: (type, flags, stream id, payload).
type Frame = (u8, u8, u32, Vec<u8>);

fn write_frame(stream: &mut TcpStream, kind: u8, flags: u8, id: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    frame.extend_from_slice(&id.to_be_bytes());
    frame.extend_from_slice(payload);
    stream.write_all(&frame).expect("write frame");
}

fn read_frame(stream: &mut TcpStream) -> Frame {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).expect("frame header");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).expect("frame payload");
    (head[3], head[4], u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]), payload)
}

/// A Predict call's request headers in HPACK, without Huffman coding or
/// the dynamic table, so the test needs no HTTP/2 library.
fn predict_headers() -> Vec<u8> {
    let literal = |out: &mut Vec<u8>, name_index: u8, value: &str| {
        out.push(name_index);
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    };
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    literal(&mut block, 0x04, "/tensorflow.serving.PredictionService/Predict"); // :path
    literal(&mut block, 0x01, "localhost"); // :authority
    block.extend_from_slice(&[0x0f, 0x10]); // content-type (static index 31) …
    block.push(16);
    block.extend_from_slice(b"application/grpc");
    block.extend_from_slice(&[0x00, 2]); // te: trailers, a new name
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    block
}

#[tokio::test]
async fn streams_past_max_concurrent_streams_are_refused_and_the_connection_keeps_its_calls() {
    let server = Server::with_config(
        "[server]\nmax_concurrent_streams = 2\n\
         [[models]]\nname = \"mlp\"\nbase_path = \"$ROOT/examples/models/mlp\"\n",
    );
    let mut h2 = connect(server.grpc);
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("preface");
    write_frame(&mut h2, 0x4, 0, 0, &[]);
    // The server's SETTINGS carry the limit: SETTINGS_MAX_CONCURRENT_STREAMS (3) = 2.
    let (kind, flags, _, settings) = read_frame(&mut h2);
    assert_eq!((kind, flags & 1), (0x4, 0), "the server's first frame is its SETTINGS");
    let advertised = settings
        .chunks(6)
        .find(|s| u16::from_be_bytes([s[0], s[1]]) == 3)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
    assert_eq!(advertised, Some(2), "settings {settings:?}");
    write_frame(&mut h2, 0x4, 0x1, 0, &[]);
    // Three calls opened and left waiting for their bodies: two fit, the
    // third is refused (RST_STREAM, REFUSED_STREAM = 7) without a reply.
    for id in [1, 3, 5] {
        write_frame(&mut h2, 0x1, 0x4, id, &predict_headers());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        assert!(Instant::now() < deadline, "no RST_STREAM for the third stream");
        let (kind, _, id, payload) = read_frame(&mut h2);
        match kind {
            0x3 => break (id, u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])),
            0x7 => panic!("the server closed the whole connection (GOAWAY {payload:?})"),
            _ => continue,
        }
    };
    assert_eq!(refused, (5, 7), "(stream, error code)");
    // The first two are still open: finishing one with an empty message
    // (a 5-byte gRPC frame of length 0) gets it an answer on this connection.
    write_frame(&mut h2, 0x0, 0x1, 1, &[0, 0, 0, 0, 0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no answer on stream 1");
        let (kind, _, id, _) = read_frame(&mut h2);
        if kind == 0x1 && id == 1 {
            break;
        }
        assert!(!(kind == 0x3 && id == 1), "stream 1 was reset");
    }
    let mut client = server.predict_client().await;
    let x = values(5, 64);
    client.predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))])).await.expect("served");
}
