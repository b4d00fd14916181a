//! Real `redis-server` processes on free loopback ports, started and
//! stopped by the tests themselves. A missing binary fails the test with a
//! message saying what to install; it never skips.

#![allow(dead_code)]

#[path = "../../examples/fleet/local_redis.rs"]
pub mod local_redis;

use std::future::Ready;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use local_redis::{find_binary, wait_until_ready};

/// The binary `name`: `$env`, or the one on `PATH`; a missing one fails
/// the test with what to install.
fn binary(name: &str, env: &str) -> PathBuf {
    find_binary(name, env).unwrap_or_else(|| {
        panic!(
            "`{name}` was not found on PATH (nor in ${env}). These tests need a real Redis \
             on loopback: install it with `apt-get install -y redis-server`, or run \
             `bash .ci/test`, which installs it."
        )
    })
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// One `redis-server`, stopped (killed) when dropped.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// A server on a free loopback port, persisting nothing.
    pub fn start() -> Self {
        Self::start_with(free_port(), Vec::new())
    }

    /// A server that takes `DEBUG` commands (`DEBUG SLEEP` makes it slow).
    pub fn start_debuggable() -> Self {
        Self::start_with(
            free_port(),
            vec!["--enable-debug-command".into(), "yes".into()],
        )
    }

    fn start_with(port: u16, extra: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("tcb-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory for redis-server");
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let child = Command::new(binary("redis-server", "REDIS_SERVER"))
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "no"])
            .args(["--dir".as_ref(), self.dir.as_os_str()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start redis-server: {e}"));
        let child = self.child.insert(child);
        if let Err(problem) = wait_until_ready(child, self.port, Duration::from_secs(10)) {
            panic!("{problem}");
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three `redis-server`s in cluster mode, every slot assigned, no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let port = free_port();
                RedisServer::start_with(
                    port,
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        format!("nodes-{port}.conf"),
                        "--cluster-node-timeout".into(),
                        "2000".into(),
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new(binary("redis-cli", "REDIS_CLI"))
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("could not run redis-cli: {e}"));
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes.iter().all(|n| cluster_ok(n.port)) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

fn cluster_ok(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"CLUSTER INFO\r\n").is_err() {
        return false;
    }
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).contains("cluster_state:ok")
}

/// A TCP server on loopback that answers every request with garbage, as a
/// broken proxy or the wrong service on Redis's port would. Stops when
/// dropped.
pub struct GarbageServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl GarbageServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("local address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let stopped = Arc::clone(&stopped);
                        std::thread::spawn(move || {
                            let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
                            let mut buf = [0u8; 1024];
                            while !stopped.load(Ordering::Relaxed) {
                                match stream.read(&mut buf) {
                                    Ok(0) => return,
                                    Ok(_) => {
                                        // A reply of a type no command returns.
                                        if stream.write_all(b"?garbage\r\n").is_err() {
                                            return;
                                        }
                                    }
                                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                                    Err(_) => return,
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        GarbageServer { port, stop }
    }
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A TCP proxy on loopback in front of a Redis server. [`stall`] makes
/// every connection open through it go silent for good (its socket stays
/// open, what is sent is swallowed), as when the host behind an address
/// dies without a reset; connections opened after [`heal`] reach Redis
/// again. Stops when dropped.
///
/// [`stall`]: StallingProxy::stall
/// [`heal`]: StallingProxy::heal
pub struct StallingProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    stalling: Arc<AtomicBool>,
    links: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>,
}

impl StallingProxy {
    pub fn start(redis_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("local address").port();
        let proxy = StallingProxy {
            port,
            stop: Arc::new(AtomicBool::new(false)),
            stalling: Arc::new(AtomicBool::new(false)),
            links: Arc::default(),
        };
        let (stop, stalling, links) = (
            Arc::clone(&proxy.stop),
            Arc::clone(&proxy.stalling),
            Arc::clone(&proxy.links),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)) else {
                    continue;
                };
                let silent = Arc::new(AtomicBool::new(stalling.load(Ordering::SeqCst)));
                links.lock().unwrap().push(Arc::clone(&silent));
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let (stop, silent) = (Arc::clone(&stop), Arc::clone(&silent));
                    std::thread::spawn(move || pump(from, to, &stop, &silent));
                }
            }
        });
        proxy
    }

    /// Every connection open now, and every one opened until [`heal`]
    /// (StallingProxy::heal), goes silent for good.
    pub fn stall(&self) {
        self.stalling.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().iter() {
            link.store(true, Ordering::SeqCst);
        }
    }

    /// Connections opened from now on reach Redis.
    pub fn heal(&self) {
        self.stalling.store(false, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Copies `from` to `to` until either closes, swallowing what arrives once
/// `silent` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, stop: &AtomicBool, silent: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) if !silent.load(Ordering::SeqCst) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The upstream the instances call: fails or succeeds on command, and
/// counts the calls that reach it.
#[derive(Clone, Default)]
pub struct Upstream {
    pub failing: Arc<AtomicBool>,
    pub calls: Arc<AtomicUsize>,
    /// When each call arrived.
    pub arrivals: Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl Upstream {
    pub fn failing() -> Self {
        let upstream = Upstream::default();
        upstream.fail();
        upstream
    }

    /// From now on every call fails.
    pub fn fail(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    pub fn recover(&self) {
        self.failing.store(false, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// A service calling this upstream.
    pub fn service(
        &self,
    ) -> impl tower::Service<
        (),
        Response = (),
        Error = tower::BoxError,
        Future = Ready<Result<(), tower::BoxError>>,
    > + Clone
           + Send
           + Sync
           + 'static {
        let upstream = self.clone();
        tower::service_fn(move |()| {
            upstream.calls.fetch_add(1, Ordering::SeqCst);
            upstream
                .arrivals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
            std::future::ready(if upstream.failing.load(Ordering::SeqCst) {
                Err("upstream failed".into())
            } else {
                Ok(())
            })
        })
    }
}

/// The store's next event; fails after 10 s.
pub async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<tower_circuit_breaker::store::redis::StoreEvent>,
) -> tower_circuit_breaker::store::redis::StoreEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("a store event within 10 s")
        .expect("the store is alive")
}

/// A connection to the Redis at `url`, for a test to look at or change
/// what the stores wrote.
pub async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to the test's Redis")
}

/// Waits (real time) until `done` holds; fails after 10 s naming `what`.
pub async fn eventually(what: &str, done: impl FnMut() -> bool) {
    eventually_within(Duration::from_secs(10), what, done).await;
}

/// Waits (real time) until `done` holds; fails after `limit` naming `what`.
pub async fn eventually_within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A breaker's name as the store escapes it in keys and messages.
pub fn escape(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The start of every key of `name`'s index shard under `prefix`, with the
/// default 16 shards, as the store's docs lay them out:
/// `<prefix>:{<prefix>:<shard>/16}`.
pub fn shard_base(prefix: &str, name: &str) -> String {
    let hash = escape(name)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{prefix}:{{{prefix}:{}/16}}", hash % 16)
}

/// Where the store keeps `part` (`record`, `wait`, `probe_lock`...) of the
/// breaker `name` under `prefix`.
pub fn breaker_key(prefix: &str, name: &str, part: &str) -> String {
    format!("{}:{}:{part}", shard_base(prefix, name), escape(name))
}

/// Redis's clock, in milliseconds.
pub async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    seconds * 1000 + micros / 1000
}

/// How many commands Redis has served, over every command.
pub async fn commands_served(url: &str) -> u64 {
    let mut conn = connect(url).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|rest| {
            rest.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
