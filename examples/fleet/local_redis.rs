//! A `redis-server` of the demo's own, on a free loopback port; also the one
//! `benches/fleet.rs` starts.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` this demo started: on a free loopback port, persisting
/// nothing, killed when dropped, so on every way out of the demo.
pub struct LocalRedis {
    child: Child,
    port: u16,
}

impl LocalRedis {
    /// Starts one and waits until it answers `PING`.
    pub fn start() -> Result<Self, String> {
        let binary = redis_server()?;
        let mut last_error = String::new();
        // A port free a moment ago may be taken before redis-server binds.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free loopback port: {e}"))?
                .port();
            match Self::spawn(&binary, port) {
                Ok(server) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    fn spawn(binary: &Path, port: u16) -> Result<Self, String> {
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "could not start {}: {e}. Install Redis with \
                     `apt-get install -y redis-server`, or set REDIS_URL to a Redis server you run.",
                    binary.display()
                )
            })?;
        // From here on, dropping `server` kills the process.
        let mut server = LocalRedis { child, port };
        wait_until_ready(&mut server.child, port, Duration::from_secs(5))?;
        Ok(server)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `redis-server` binary: `$REDIS_SERVER`, or the one on `PATH`.
fn redis_server() -> Result<PathBuf, String> {
    find_binary("redis-server", "REDIS_SERVER").ok_or_else(|| {
        "`redis-server` was not found on PATH. This demo starts a Redis of its own on \
         loopback: install it with `apt-get install -y redis-server`, or set REDIS_URL \
         to a Redis server you run."
            .to_owned()
    })
}

/// The binary `name`: the path in the environment variable `env`, or the
/// one on `PATH`.
pub fn find_binary(name: &str, env: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Waits until the `redis-server` just started as `child` answers `PING`
/// on `port`: an error if it exits first or stays silent for `limit`.
pub fn wait_until_ready(child: &mut Child, port: u16, limit: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if answers_ping(port) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "redis-server exited at start on port {port} ({status})"
            ));
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "redis-server on port {port} did not answer PING within {limit:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `PING` and expects `+PONG`.
pub fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}
