//! Real `redis-server` processes on free loopback ports, started and
//! stopped by the tests themselves. A missing binary fails the test with a
//! message saying what to install; it never skips.

#![allow(dead_code)]

#[path = "../../examples/fleet/local_redis.rs"]
pub mod local_redis;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// A free loopback port for a Cluster node: its bus port (the port plus
/// 10,000) must exist and be free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
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

/// `redis-server`s in cluster mode, every slot assigned: three masters,
/// and with [`start_replicated`](Self::start_replicated) a replica of
/// each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// One node as `CLUSTER NODES` tells of it.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The id of its master, if it is a replica.
    pub master_id: Option<String>,
    /// Marked failing (`fail` or `fail?`).
    pub failing: bool,
    /// The slot ranges it serves.
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Three masters, no replicas, a node timeout of 2 s.
    pub fn start() -> Self {
        Self::launch(3, 0, 2000, &[])
    }

    /// Three masters and a replica of each, a node timeout of 1 s, every
    /// node given `extra` settings (`--cluster-require-full-coverage no`,
    /// say); returns once every replica has synced with its master.
    pub fn start_replicated(extra: &[&str]) -> Self {
        let cluster = Self::launch(6, 1, 1000, extra);
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in cluster.nodes.iter() {
            loop {
                let info = node_command(node.port, &["INFO", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "replica {} never synced",
                    node.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    fn launch(nodes: usize, replicas: u32, node_timeout_ms: u32, extra: &[&str]) -> Self {
        let nodes: Vec<RedisServer> = (0..nodes)
            .map(|_| {
                let port = free_cluster_port();
                let mut settings = vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    format!("nodes-{port}.conf"),
                    "--cluster-node-timeout".to_owned(),
                    node_timeout_ms.to_string(),
                ];
                settings.extend(extra.iter().map(|s| (*s).to_owned()));
                RedisServer::start_with(port, settings)
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
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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

    /// The nodes as a live node (any but `except`) tells of them.
    pub fn live_nodes(&self, except: &[u16]) -> Vec<ClusterNode> {
        let asked = self
            .nodes
            .iter()
            .find(|n| n.child.is_some() && !except.contains(&n.port))
            .expect("a live node");
        parse_nodes(&node_command(asked.port, &["CLUSTER", "NODES"]))
    }

    /// The port of the master serving `slot` now.
    pub fn master_of(&self, slot: u16) -> u16 {
        let nodes = self.live_nodes(&[]);
        nodes
            .iter()
            .find(|n| {
                n.master && !n.failing && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {nodes:?}"))
    }

    /// The port of a replica of the master on `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        let nodes = self.live_nodes(&[port]);
        let master = nodes.iter().find(|n| n.port == port).expect("the master");
        nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(master.id.as_str()))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no replica of {port}"))
    }

    /// Kills the node on `port` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
            .kill();
    }
}

/// `CLUSTER NODES`, parsed.
fn parse_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags, master) =
                (words.first()?, words.get(1)?, words.get(2)?, words.get(3)?);
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = words[8.min(words.len())..]
                .iter()
                .filter(|w| !w.starts_with('['))
                .filter_map(|range| {
                    let mut ends = range.split('-');
                    let from = ends.next()?.parse().ok()?;
                    let to = ends.next().map_or(Some(from), |t| t.parse().ok())?;
                    Some((from, to))
                })
                .collect();
            Some(ClusterNode {
                id: (*id).to_owned(),
                port,
                master: flags.split(',').any(|f| f == "master"),
                master_id: (*master != "-").then(|| (*master).to_owned()),
                failing: flags.split(',').any(|f| f == "fail" || f == "fail?"),
                slots,
            })
        })
        .collect()
}

/// Runs `words` on the node on `port` (a connection of its own, no
/// cluster routing); its answer, as text.
pub fn node_command(port: u16, words: &[&str]) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a node URL");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("no connection to node {port}: {e}"));
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    match cmd.query::<redis::Value>(&mut conn) {
        Ok(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        Ok(redis::Value::SimpleString(text)) => text,
        Ok(redis::Value::Okay) => "OK".to_owned(),
        Ok(other) => format!("{other:?}"),
        Err(e) => panic!("{words:?} on node {port}: {e}"),
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
