//! Study 3: what a fleet costs Redis as keys and instances grow.
//!
//! For each row, a fresh `redis-server` (the study's own, on a free
//! loopback port), then M store instances in this process, each a
//! registry of the same K keyed breakers attached to its own
//! [`RedisStore`] (its own connections, a 1 s refresh interval and the
//! default 250 ms command timeout), as M processes of a service would be.
//! Before the instances start, another store has opened the last key for
//! the fleet (and, in the rows with keys open, 1% of the keys, which then
//! stay open: the fleet probes each once per 1 s open period, with a
//! failing active probe, and reopens it).
//!
//! Reported, from Redis's own `INFO` (`commandstats`, `cpu`, `stats`)
//! before and after a steady window once every instance has synced:
//! commands per second, Redis CPU seconds per second, bytes per second in
//! and out, the refresh rounds that succeeded out of those due (M per
//! interval), and the first-sync time: from an instance's start (its
//! store built, then its K breakers made and attached, the key opened
//! beforehand last) until that key's breaker reads open, watched from a
//! thread of its own (the slowest instance; "never" past the limit).

use std::future::ready;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::ErrorsAsFailures;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::Registry;
use tower_circuit_breaker::store::redis::RedisStore;
use tower_circuit_breaker::{Breaker, Config, State};

use crate::local_redis::LocalRedis;

/// The refresh interval every instance runs with.
const REFRESH: Duration = Duration::from_secs(1);

/// One row of the study.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub keys: usize,
    pub instances: usize,
    /// Keys open for the fleet (and cycling) during the window, per
    /// hundred keys: 0 or 1.
    pub open_percent: usize,
}

/// What one row measured.
#[derive(Clone, Debug)]
pub struct Figures {
    pub row: Row,
    pub window: Duration,
    pub commands_per_s: f64,
    /// Scripts run (`EVALSHA`), per second: each counts in
    /// `commands_per_s` with the commands it runs.
    pub scripts_per_s: f64,
    /// Openings and closings published, per second: the fleet's changes.
    pub changes_per_s: f64,
    pub cpu_per_s: f64,
    pub bytes_per_s: f64,
    /// The commands served most in the window, per second.
    pub top_commands: Vec<(String, f64)>,
    pub rounds_ok: u64,
    pub rounds_due: u64,
    /// The slowest instance's first sync; `None`: not within the limit.
    pub first_sync: Option<Duration>,
    /// Episodes of Redis unavailable during the window, over instances.
    pub unavailable: u64,
    /// Rounds of index pages slower than the command timeout during the
    /// window, over instances.
    pub slow_reads: u64,
    /// Rounds of probe-lock attempts answered after the command timeout
    /// during the window, over instances.
    pub slow_lock_rounds: u64,
    /// Batches of writes answered after the command timeout (Redis busy,
    /// not down) during the window, over instances.
    pub slow_write_rounds: u64,
    /// CPU seconds per second this process (the M instances) used during
    /// the window, from `/proc/self/stat`; `None` where there is none.
    pub own_cpu_per_s: Option<f64>,
}

/// CPU seconds this process has used (user and system), from
/// `/proc/self/stat` (Linux; ticks of 1/100 s, the kernel's usual
/// `USER_HZ`); `None` elsewhere.
fn own_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Redis's counters at one moment.
#[derive(Clone, Debug, Default)]
struct Counters {
    commands: u64,
    /// Calls per command.
    by_command: Vec<(String, u64)>,
    cpu_s: f64,
    bytes: u64,
}

async fn info(conn: &mut MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

async fn counters(conn: &mut MultiplexedConnection) -> Counters {
    let commandstats = info(conn, "commandstats").await;
    // `cmdstat_<name>:calls=<n>,usec=...`
    let by_command: Vec<(String, u64)> = commandstats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect();
    let commands = by_command.iter().map(|(_, n)| n).sum();
    let cpu = info(conn, "cpu").await;
    let seconds = |name| {
        field(&cpu, name)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stats = info(conn, "stats").await;
    let bytes = |name| {
        field(&stats, name)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Counters {
        commands,
        by_command,
        cpu_s: seconds("used_cpu_sys") + seconds("used_cpu_user"),
        bytes: bytes("total_net_input_bytes") + bytes("total_net_output_bytes"),
    }
}

fn key(i: usize) -> String {
    format!("k{i}")
}

/// Every key's config: one failure opens it, for 1 s at every attempt
/// (an active prober's included).
fn config() -> Config {
    Config::builder()
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_secs(1))
        .probe_interval(Duration::from_secs(1))
        .backoff(1.0)
        .build()
        .expect("config")
}

/// The config of the key opened before the instances start: open for ten
/// minutes, so that it stays open while the row runs.
fn marker_config() -> Config {
    Config::builder()
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_secs(600))
        .max_open(Duration::from_secs(600))
        .build()
        .expect("config")
}

fn failing() -> impl Service<
    (),
    Response = (),
    Error = BoxError,
    Future = std::future::Ready<Result<(), BoxError>>,
> + Clone
       + Send
       + 'static {
    service_fn(|()| ready(Err::<(), BoxError>("upstream down".into())))
}

/// Opens `names` for the fleet from a store of its own, each with one
/// failure under `config`; returns once every opening is written.
fn open_for_the_fleet(runtime: &Runtime, url: &str, names: &[String], config: &Config) {
    let _context = runtime.enter();
    let store = RedisStore::builder(url)
        .prefix("scale")
        .refresh_interval(Duration::from_secs(3600))
        .build()
        .expect("a valid store");
    let breakers: Vec<Breaker> = names
        .iter()
        .map(|name| {
            let breaker = Breaker::new(
                config
                    .to_builder()
                    .name(name.as_str())
                    .build()
                    .expect("config"),
            );
            store.attach(&breaker);
            breaker
        })
        .collect();
    runtime.block_on(async {
        // Connected and synced first: a trip while the store cannot reach
        // Redis would stay local.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(store.stats().available && store.stats().refreshes > 0) {
            assert!(
                Instant::now() < deadline,
                "the opening store did not sync within 30 s: {:?}",
                store.stats()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for breaker in &breakers {
            let mut service = breaker.layer().layer(failing());
            let _ = service.ready().await.expect("ready").call(()).await;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.stats().writes < names.len() as u64 {
            assert!(
                Instant::now() < deadline,
                "the openings were not written within 30 s: {:?}",
                store.stats()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

/// One instance: its store, its registry, and the breakers it holds.
struct Instance {
    store: RedisStore,
    _registry: Registry<String>,
    _held: Vec<Breaker>,
}

/// An instance's breaker of the key opened beforehand, from its start.
struct Watched {
    started: Instant,
    marker: Breaker,
    synced: Option<Duration>,
}

pub fn run(row: Row, window: Duration, sync_limit: Duration) -> Figures {
    // A runtime per row: the stores' tasks, two workers, as a service's
    // runtime on a small machine would have (Redis shares the machine's two
    // cores). Dropped with the row, it takes every task of the row with it,
    // so that a row's stragglers never weigh on the next.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runtime = &runtime;
    let server = LocalRedis::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let marker = key(row.keys - 1);
    let open: Vec<String> = (0..row.keys * row.open_percent / 100).map(key).collect();
    open_for_the_fleet(
        runtime,
        &url,
        std::slice::from_ref(&marker),
        &marker_config(),
    );
    if !open.is_empty() {
        open_for_the_fleet(runtime, &url, &open, &config());
    }

    // First sync, watched from a thread of its own from each instance's
    // start: each instance's breaker of the key opened beforehand (made
    // last, after every other key) reads open.
    let watched: Arc<Mutex<Vec<Watched>>> = Arc::default();
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (watched, watching) = (Arc::clone(&watched), Arc::clone(&watching));
        std::thread::spawn(move || {
            while watching.load(Ordering::Relaxed) {
                for w in watched.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                    if w.synced.is_none() && w.marker.state() == State::Open {
                        w.synced = Some(w.started.elapsed());
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let instances: Vec<Instance> = (0..row.instances)
        .map(|i| {
            let _context = runtime.enter();
            let started = Instant::now();
            let store = RedisStore::builder(&url)
                .prefix("scale")
                .instance(format!("i{i}"))
                .refresh_interval(REFRESH)
                .build()
                .expect("a valid store");
            let registry: Registry<String> = Registry::builder()
                .default_config(config())
                .config(marker.clone(), marker_config())
                .max_keys(row.keys)
                .store(&store)
                .build();
            for k in 0..row.keys {
                registry.get(&key(k)).expect("room for every key");
            }
            let marker = registry.get(&marker).expect("the marker");
            watched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Watched {
                    started,
                    marker,
                    synced: None,
                });
            let held: Vec<Breaker> = open
                .iter()
                .map(|name| {
                    let breaker = registry.get(name).expect("an open key");
                    breaker.probe_actively(failing(), || (), ErrorsAsFailures);
                    breaker
                })
                .collect();
            Instance {
                store,
                _registry: registry,
                _held: held,
            }
        })
        .collect();
    let deadline = Instant::now() + sync_limit;
    let synced = |watched: &Mutex<Vec<Watched>>| -> Option<Vec<Duration>> {
        let watched = watched.lock().unwrap_or_else(|p| p.into_inner());
        watched.iter().map(|w| w.synced).collect()
    };
    while synced(&watched).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    watching.store(false, Ordering::Relaxed);
    let _ = watcher.join();
    let first_sync = synced(&watched).and_then(|all| all.into_iter().max());
    // Let the start-up settle: one more interval.
    std::thread::sleep(REFRESH);

    let mut conn = runtime.block_on(async {
        redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the study's Redis")
    });
    let before_stats: Vec<_> = instances.iter().map(|i| i.store.stats()).collect();
    let before = runtime.block_on(counters(&mut conn));
    let cpu_before = own_cpu_s();
    let started = Instant::now();
    std::thread::sleep(window);
    let after = runtime.block_on(counters(&mut conn));
    let elapsed = started.elapsed().as_secs_f64();
    let own_cpu_per_s = cpu_before
        .zip(own_cpu_s())
        .map(|(before, after)| (after - before) / elapsed);
    let after_stats: Vec<_> = instances.iter().map(|i| i.store.stats()).collect();
    let rounds_ok = before_stats
        .iter()
        .zip(&after_stats)
        .map(|(b, a)| a.refreshes - b.refreshes)
        .sum();
    let unavailable = before_stats
        .iter()
        .zip(&after_stats)
        .map(|(b, a)| a.unavailable_episodes - b.unavailable_episodes)
        .sum();
    let slow_reads = before_stats
        .iter()
        .zip(&after_stats)
        .map(|(b, a)| a.slow_reads - b.slow_reads)
        .sum();
    let slow_lock_rounds = before_stats
        .iter()
        .zip(&after_stats)
        .map(|(b, a)| a.slow_lock_rounds - b.slow_lock_rounds)
        .sum();
    let slow_write_rounds = before_stats
        .iter()
        .zip(&after_stats)
        .map(|(b, a)| a.slow_write_rounds - b.slow_write_rounds)
        .sum();
    drop(instances);
    drop(server);
    // The three INFO calls of the first snapshot are inside the window.
    let commands = after.commands.saturating_sub(before.commands + 3);
    let calls_of = |name: &str| -> f64 {
        let count = |c: &Counters| {
            c.by_command
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, calls)| *calls)
        };
        count(&after).saturating_sub(count(&before)) as f64
    };
    let mut top_commands: Vec<(String, f64)> = after
        .by_command
        .iter()
        .map(|(name, calls)| {
            let earlier = before
                .by_command
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, c)| *c);
            (name.clone(), calls.saturating_sub(earlier) as f64 / elapsed)
        })
        .filter(|(name, per_s)| name != "info" && *per_s > 0.0)
        .collect();
    top_commands.sort_by(|a, b| b.1.total_cmp(&a.1));
    top_commands.truncate(5);
    Figures {
        row,
        window,
        commands_per_s: commands as f64 / elapsed,
        scripts_per_s: calls_of("evalsha") / elapsed,
        changes_per_s: (calls_of("publish") + calls_of("spublish")) / elapsed,
        cpu_per_s: (after.cpu_s - before.cpu_s) / elapsed,
        bytes_per_s: after.bytes.saturating_sub(before.bytes) as f64 / elapsed,
        top_commands,
        rounds_ok,
        rounds_due: (row.instances as f64 * elapsed / REFRESH.as_secs_f64()).round() as u64,
        first_sync,
        unavailable,
        slow_reads,
        slow_lock_rounds,
        slow_write_rounds,
        own_cpu_per_s,
    }
}

/// Prints the study's table.
pub fn report(rows: &[Figures], sync_limit: Duration) {
    println!();
    let window = rows.first().map_or(0.0, |f| f.window.as_secs_f64());
    println!(
        "fleet scale: M instances in one process, each attaching the same K keyed breakers to \
         its own store (1 s refresh, 250 ms command timeout); Redis's INFO over {window:.0} s \
         windows"
    );
    println!(
        "(commands as Redis counts them: a script counts once as EVALSHA and once for each \
         command it runs)"
    );
    println!(
        "{:>8} {:>4} {:>6} {:>12} {:>10} {:>10} {:>10} {:>12} {:>12} {:>11} {:>12} {:>10} {:>10} {:>11} {:>13}",
        "K",
        "M",
        "open",
        "commands/s",
        "scripts/s",
        "changes/s",
        "CPU s/s",
        "bytes/s",
        "rounds ok",
        "first sync",
        "unavailable",
        "slow reads",
        "slow locks",
        "slow writes",
        "own CPU s/s"
    );
    for f in rows {
        let sync = match f.first_sync {
            Some(d) => format!("{:.2} s", d.as_secs_f64()),
            None => format!("> {} s", sync_limit.as_secs()),
        };
        println!(
            "{:>8} {:>4} {:>5}% {:>12.0} {:>10.0} {:>10.0} {:>10.4} {:>12.0} {:>5} / {:<5} {:>11} {:>12} {:>10} {:>10} {:>11} {:>13}",
            f.row.keys,
            f.row.instances,
            f.row.open_percent,
            f.commands_per_s,
            f.scripts_per_s,
            f.changes_per_s,
            f.cpu_per_s,
            f.bytes_per_s,
            f.rounds_ok,
            f.rounds_due,
            sync,
            f.unavailable,
            f.slow_reads,
            f.slow_lock_rounds,
            f.slow_write_rounds,
            f.own_cpu_per_s
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.2}"))
        );
    }
}
