//! Running a server as a child process and waiting until it serves: used by
//! the benchmarks and the integration tests to drive the real binary.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A child server process, killed when dropped.
pub struct ServerProcess {
    child: Child,
    /// The address it printed in its ready line.
    pub addr: SocketAddr,
    log: Mutex<mpsc::Receiver<String>>,
    stdout: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Spawns `command` and waits up to `timeout` for a stdout line
    /// starting with `ready_prefix` followed by the address. stderr is
    /// collected (and echoed when `echo` is set, prefixed by `name`).
    pub fn spawn(
        mut command: Command,
        name: &str,
        ready_prefix: &str,
        timeout: Duration,
        echo: bool,
    ) -> Result<ServerProcess, String> {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_parent(&mut command);
        let mut child = command.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (log_tx, log) = mpsc::channel();
        let tag = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{tag}] {line}");
                }
                let _ = log_tx.send(line);
            }
        });
        let (ready_tx, ready) = mpsc::channel();
        let prefix = ready_prefix.to_string();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix(&prefix) {
                    let _ = ready_tx.send(addr.trim().to_string());
                }
                if let Ok(mut seen) = seen.lock() {
                    seen.push(line);
                }
            }
        });
        let addr = match ready.recv_timeout(timeout) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let lines: Vec<String> = log.try_iter().collect();
                return Err(format!("{name} did not become ready (exit: {status:?}); stderr:\n{}", lines.join("\n")));
            }
        };
        let addr = addr.parse().map_err(|e| format!("{name} printed a bad address {addr:?}: {e}"))?;
        Ok(ServerProcess { child, addr, log: Mutex::new(log), stdout: lines })
    }

    /// The rest of the first stdout line that starts with `prefix`, trimmed.
    pub fn stdout_after(&self, prefix: &str) -> Option<String> {
        let lines = self.stdout.lock().ok()?;
        lines.iter().find_map(|l| l.strip_prefix(prefix).map(|rest| rest.trim().to_string()))
    }

    /// Waits up to `timeout` for a stdout line starting with `prefix`;
    /// returns the rest of it, trimmed.
    pub fn wait_stdout(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Some(rest) = self.stdout_after(prefix) {
                return Some(rest);
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.stdout_after(prefix);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// stderr lines written since the last call.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().map(|log| log.try_iter().collect()).unwrap_or_default()
    }

    /// Resident memory of the process in bytes (from /proc), if readable.
    pub fn rss_bytes(&self) -> Option<u64> {
        sluice::metrics::resident_bytes(Some(self.child.id()))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the child die with this process, even on an abort.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe, as pre_exec requires.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
}
