//! The fleet steered as one: an operator at one instance's admin endpoint
//! forces a name open (or closed, disabled, reset) and every instance's
//! breaker of that name follows, within one refresh interval, and so does
//! its undoing. Each instance is its own `RedisStore` with its own
//! registry and its own admin endpoint served over HTTP on loopback, as
//! separate processes would be; on one `redis-server` and on a 3-master,
//! 3-replica Cluster.

use crate::common::admin::{get, post, serve};
use crate::common::redis as redis_support;
use crate::common::Upstream;

use std::net::SocketAddr;
use std::time::Duration;

use redis_support::{eventually_within, RedisCluster, RedisServer};
use tokio::time::Instant;
use tower::{BoxError, Layer as _, Service, ServiceExt};
use tower_circuit_breaker::admin::Admin;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::Registry;
use tower_circuit_breaker::store::redis::{RedisStore, RedisStoreBuilder};
use tower_circuit_breaker::store::Fleet;
use tower_circuit_breaker::{CircuitOpen, Config, Control, State};

/// The refresh interval: the bound within which every instance must carry
/// out a control (pub/sub makes it milliseconds).
const REFRESH: Duration = Duration::from_secs(1);

/// One instance: its store, its registry of breakers and its admin
/// endpoint (with control and the fleet).
struct Node {
    store: RedisStore,
    registry: Registry<String>,
    admin: SocketAddr,
}

impl Node {
    async fn start(store: RedisStoreBuilder) -> Self {
        let store = store
            .refresh_interval(REFRESH)
            .probe_lease(Duration::from_millis(800))
            .hold(Duration::from_millis(1300))
            .command_timeout(Duration::from_millis(400))
            .build()
            .expect("a valid store");
        let config = Config::builder()
            .trip(ConsecutiveFailures::new(2))
            .cooldown(Duration::from_secs(30))
            .build()
            .expect("a valid config");
        let registry = Registry::builder()
            .default_config(config)
            .store(&store)
            .build();
        let admin = serve(
            Admin::new(registry.clone())
                .fleet(&store)
                .control(true)
                .router(),
        )
        .await;
        Node {
            store,
            registry,
            admin,
        }
    }

    fn state(&self, name: &str) -> State {
        self.registry.get(&name.to_owned()).unwrap().state()
    }

    async fn call(&self, name: &str, upstream: &Upstream<()>) -> Result<(), BoxError> {
        let breaker = self.registry.get(&name.to_owned()).unwrap();
        let mut service = breaker.layer().layer(upstream.clone());
        service.ready().await?.call(()).await
    }
}

/// `n` nodes, each with its breaker of `name` made, every one synced with
/// the fleet.
async fn fleet(n: usize, store: impl Fn() -> RedisStoreBuilder, name: &str) -> Vec<Node> {
    let mut nodes = Vec::new();
    for _ in 0..n {
        let node = Node::start(store()).await;
        node.state(name);
        nodes.push(node);
    }
    synced(&nodes).await;
    nodes
}

async fn synced(nodes: &[Node]) {
    eventually_within(
        Duration::from_secs(15),
        "every instance read the fleet",
        || {
            nodes
                .iter()
                .all(|n| n.store.stats().refreshes > 0 && n.store.stats().messages > 0)
        },
    )
    .await;
}

/// Waits until every node's breaker of `name` is in `state`; fails if that
/// takes longer than one refresh interval from `since`. Returns how long
/// it took.
async fn all_within_a_refresh(
    nodes: &[Node],
    name: &str,
    state: State,
    since: Instant,
) -> Duration {
    let left = (since + REFRESH).saturating_duration_since(Instant::now());
    eventually_within(
        left,
        &format!("every instance's {name} {state:?} within one refresh interval"),
        || nodes.iter().all(|n| n.state(name) == state),
    )
    .await;
    since.elapsed()
}

/// What a refused call says: the breaker refused it, and the upstream saw
/// nothing.
async fn refused_everywhere(nodes: &[Node], name: &str, upstream: &Upstream<()>) {
    let before = upstream.calls();
    for node in nodes {
        let err = node.call(name, upstream).await.expect_err("refused");
        assert!(CircuitOpen::find(err.as_ref()).is_some(), "{err}");
    }
    assert_eq!(
        upstream.calls(),
        before,
        "a refused call reached the upstream"
    );
}

/// The whole story on `nodes`: force-open from node 0's admin, seen by
/// every node and by a node started afterwards, read back through another
/// node's admin, restored from a third node's admin.
async fn force_open_reaches_every_instance_and_so_does_restore(
    mut nodes: Vec<Node>,
    store: impl Fn() -> RedisStoreBuilder,
) {
    let name = "openai/gpt-x";
    let upstream = Upstream::default();
    let path = |action: &str| format!("/fleet/{action}?breaker=openai%2Fgpt-x");

    let sent = Instant::now();
    let answer = post(nodes[0].admin, &path("force-open")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["action"], "force-open");
    assert_eq!(json["fleet"]["control"], "forced_open");
    assert_eq!(
        json["local"]["state"], "forced_open",
        "this instance at once"
    );
    let took = all_within_a_refresh(&nodes, name, State::ForcedOpen, sent).await;
    let first = nodes.len();
    refused_everywhere(&nodes, name, &upstream).await;

    // An instance started after the control carries it out on attaching.
    let late = Node::start(store()).await;
    assert_eq!(
        late.store.control(name, Control::ForceOpen(None)).await,
        Ok(()),
        "the same control again is no error"
    );
    late.state(name);
    nodes.push(late);
    synced(&nodes).await;
    eventually_within(
        Duration::from_secs(5),
        "the late instance held open",
        || nodes.last().unwrap().state(name) == State::ForcedOpen,
    )
    .await;

    // The fleet's view from another instance, beside its local one.
    let view = get(nodes[2].admin, "/fleet?breaker=openai%2Fgpt-x").await;
    assert_eq!(view.status, 200, "{}", view.body);
    let view = view.json();
    assert_eq!(view["breaker"], name);
    assert_eq!(view["instance"], nodes[2].store.instance());
    assert_eq!(view["shared"], true);
    assert_eq!(view["fleet"]["control"], "forced_open");
    assert_eq!(view["fleet"]["state"], "closed", "a hold is not an opening");
    assert_eq!(view["local"]["state"], "forced_open");

    let sent = Instant::now();
    let answer = post(nodes[1].admin, &path("restore")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["fleet"]["control"], serde_json::Value::Null);
    let undone = all_within_a_refresh(&nodes, name, State::Closed, sent).await;
    for node in &nodes {
        node.call(name, &upstream).await.expect("served again");
    }
    assert_eq!(upstream.calls(), nodes.len());
    eprintln!(
        "{first} instances held open everywhere {took:?} after the request; {} restored everywhere {undone:?} after",
        nodes.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_wide_force_open_from_one_admin_reaches_every_instance_and_so_does_restore() {
    let server = RedisServer::start();
    let store = || RedisStore::builder(server.url()).prefix("steer");
    let nodes = fleet(4, store, "openai/gpt-x").await;
    force_open_reaches_every_instance_and_so_does_restore(nodes, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_wide_force_open_reaches_every_instance_on_a_replicated_cluster() {
    let cluster = RedisCluster::start_replicated(&[]);
    let store = || RedisStore::cluster_builder(cluster.urls()).prefix("steer");
    let nodes = fleet(4, store, "openai/gpt-x").await;
    force_open_reaches_every_instance_and_so_does_restore(nodes, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_no_instance_hears_is_read_at_its_next_refresh() {
    let server = RedisServer::start();
    let store = || RedisStore::builder(server.url()).prefix("unheard");
    let name = "cohere";
    let nodes = fleet(3, store, name).await;
    let mut admin = redis_support::connect(&server.url()).await;
    for (control, state) in [
        (Control::ForceOpen(None), State::ForcedOpen),
        (Control::Restore, State::Closed),
    ] {
        // Every subscription cut just before: only the refresh can tell.
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut admin)
            .await
            .unwrap();
        let sent = Instant::now();
        Fleet::from(&nodes[0].store)
            .control(name, control)
            .await
            .unwrap();
        // One refresh interval, and the read of the shard that moved.
        let left =
            (sent + REFRESH + Duration::from_millis(250)).saturating_duration_since(Instant::now());
        eventually_within(left, &format!("{control:?} read by every instance"), || {
            nodes.iter().all(|n| n.state(name) == state)
        })
        .await;
        eprintln!(
            "{control:?} read by every instance {:?} after",
            sent.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_fleet_force_open_ends_in_one_probe_for_the_whole_fleet() {
    let server = RedisServer::start();
    let store = || RedisStore::builder(server.url()).prefix("timed");
    let name = "anthropic";
    let nodes = fleet(4, store, name).await;
    let upstream = Upstream::default();

    let sent = Instant::now();
    let answer = post(nodes[3].admin, "/fleet/force-open?breaker=anthropic&for=2s").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let opening = &answer.json()["fleet"]["opening"];
    assert!(
        opening["open_for_ms"].as_u64().unwrap() <= 2000,
        "{opening}"
    );
    all_within_a_refresh(&nodes, name, State::Open, sent).await;
    refused_everywhere(&nodes, name, &upstream).await;

    // Once the period is over, the instances race for the probe lock: one
    // wins, its breaker goes half-open and probes; the rest keep refusing
    // and close when the fleet does.
    eventually_within(Duration::from_secs(6), "one instance half-open", || {
        nodes.iter().any(|n| n.state(name) == State::HalfOpen)
    })
    .await;
    let half_open: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.state(name) == State::HalfOpen)
        .collect();
    assert_eq!(half_open.len(), 1, "one prober for the fleet");
    let others: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.state(name) != State::HalfOpen)
        .collect();
    let before = upstream.calls();
    for node in &others {
        node.call(name, &upstream)
            .await
            .expect_err("refused while another probes");
    }
    assert_eq!(upstream.calls(), before);
    half_open[0].call(name, &upstream).await.expect("the probe");
    eventually_within(
        Duration::from_secs(3),
        "the fleet closed on the probe",
        || nodes.iter().all(|n| n.state(name) == State::Closed),
    )
    .await;
    assert_eq!(upstream.calls(), 1, "one probe reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_wide_reset_forgets_the_fleets_opening_and_closes_every_instance() {
    let server = RedisServer::start();
    let store = || RedisStore::builder(server.url()).prefix("reset");
    let name = "mistral";
    let nodes = fleet(3, store, name).await;
    let upstream = Upstream::failing();
    // Two failures at node 0 open the fleet.
    for _ in 0..2 {
        nodes[0].call(name, &upstream).await.expect_err("failed");
    }
    eventually_within(Duration::from_secs(5), "the fleet open", || {
        nodes.iter().all(|n| n.state(name) == State::Open)
    })
    .await;
    let view = get(nodes[1].admin, "/fleet?breaker=mistral").await.json();
    assert_eq!(view["fleet"]["state"], "open", "{view}");
    assert!(view["fleet"]["opening"]["kept_for_ms"].as_u64().unwrap() > 0);

    let sent = Instant::now();
    let answer = post(nodes[2].admin, "/fleet/reset?breaker=mistral").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["fleet"]["state"], "closed");
    assert_eq!(answer.json()["fleet"]["opening"], serde_json::Value::Null);
    all_within_a_refresh(&nodes, name, State::Closed, sent).await;
    // Forgotten everywhere: one failure more does not reopen (the
    // policy's count started again too).
    nodes[1].call(name, &upstream).await.expect_err("failed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(nodes.iter().all(|n| n.state(name) == State::Closed));
    let state = Fleet::from(&nodes[0].store).state(name).await.unwrap();
    assert_eq!((state.opening, state.failures), (None, 1));
}
