//! A real `redis-server` for tests: on a free port, no persistence, killed
//! when dropped, and killable and restartable on the same port mid-test.
//! A port is free only until someone takes it, so each start checks that
//! the server answering is the child just started (its `process_id`), and
//! a start whose child died (the port was taken meanwhile) tries another
//! port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
            let mut server = RedisServer { child: None, port };
            match server.try_start() {
                Ok(()) => return server,
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start on any of 5 free ports; last: {last}");
    }

    /// Starts one serving only TLS on a free port with the certificate
    /// `cert` and key `key` (PEM files), requiring client certificates
    /// signed by `ca` and the password `password`; waits until the port
    /// accepts.
    pub fn start_tls(cert: &str, key: &str, ca: &str, password: &str) -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-cert-file", cert, "--tls-key-file", key])
            .args(["--tls-ca-cert-file", ca, "--tls-auth-clients", "yes", "--requirepass", password])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: run scripts/setup");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server (TLS) on port {port} did not listen in 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        RedisServer { child: Some(child), port }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (SIGKILL): clients see their connections drop.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        if let Err(why) = self.try_start() {
            panic!("redis-server did not restart on port {}: {why}", self.port);
        }
    }

    /// Starts the child on `self.port` and waits until it, not another
    /// process on that port, answers.
    fn try_start(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: run scripts/setup");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("it exited ({status}): port {} was taken", self.port));
            }
            if self.command(&[b"PING"]).as_deref() == Some("+PONG\r\n") {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("it did not answer PING on port {} in 20 s", self.port));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let info = self.command(&[b"INFO", b"server"]).unwrap_or_default();
        let answering = info.lines().find_map(|line| line.strip_prefix("process_id:")).map(str::trim);
        if answering != Some(pid.to_string().as_str()) {
            self.kill();
            return Err(format!("port {} is answered by process {answering:?}, not this test's {pid}", self.port));
        }
        Ok(())
    }

    /// Sends one command and returns the raw reply (None when it does not
    /// answer).
    pub fn command(&self, args: &[&[u8]]) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
        stream.write_all(&request).ok()?;
        let mut reply = vec![0u8; 4096];
        let n = stream.read(&mut reply).ok()?;
        Some(String::from_utf8_lossy(&reply[..n]).into_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
