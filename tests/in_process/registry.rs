//! Keyed breakers: bounds and eviction, parents, reload, snapshots, groups
//! and events, through the registry and the keyed service.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::advance;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{KeyedLayer, Registry, RegistryFull};
use tower_circuit_breaker::{CircuitBreaker, CircuitOpen, Config, State};

fn config(threshold: u32) -> Config {
    Config::builder()
        .trip(ConsecutiveFailures::new(threshold))
        .cooldown(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn keys(registry: &Registry<String>) -> Vec<String> {
    let mut keys: Vec<String> = registry.breakers().into_iter().map(|(k, _)| k).collect();
    keys.sort();
    keys
}

/// A registry of at most `max_keys` breakers, each tripping on five
/// consecutive failures.
fn bounded(max_keys: usize) -> Registry<String> {
    Registry::<String>::builder()
        .default_config(config(5))
        .max_keys(max_keys)
        .build()
}

/// A registry bounded to sixteen keys, filled with `k00` to `k15` in order.
fn sixteen_keys_held() -> Registry<String> {
    let registry = bounded(16);
    for i in 0..16 {
        registry.get(&format!("k{i:02}")).unwrap();
    }
    registry
}

/// A registry where `a/b` has parent `a`: children trip on `threshold`
/// consecutive failures, `parent` on `parent_threshold`.
fn with_parents(threshold: u32, parent: &str, parent_threshold: u32) -> Registry<String> {
    Registry::<String>::builder()
        .default_config(config(threshold))
        .config(parent.into(), config(parent_threshold))
        .parent(|key: &String| key.split_once('/').map(|(p, _)| p.to_string()))
        .build()
}

/// A keyed service over `registry`: requests are `(key, fail)`.
fn keyed(
    registry: &Registry<String>,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<(String, bool), Response = (), Error = BoxError> + Clone {
    ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), |req: &(String, bool)| {
            req.0.clone()
        }))
        .service(service_fn(move |(_, fail): (String, bool)| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if fail {
                    Err(BoxError::from("down"))
                } else {
                    Ok(())
                }
            }
        }))
}

#[test]
fn one_breaker_per_key_named_by_its_key() {
    let registry = Registry::<String>::new(config(5));
    let a = registry.get(&"a".into()).unwrap();
    let again = registry.get(&"a".into()).unwrap();
    let b = registry.get(&"b".into()).unwrap();
    assert!(a.ptr_eq(&again));
    assert!(!a.ptr_eq(&b));
    assert_eq!((a.name(), b.name()), ("a", "b"));
    assert_eq!(registry.len(), 2);
}

#[test]
fn per_key_config_overrides_the_default() {
    let special = Config::builder()
        .cooldown(Duration::from_secs(99))
        .build()
        .unwrap();
    let registry = Registry::<String>::builder()
        .default_config(config(5))
        .config("slow".into(), special)
        .build();
    let slow = registry.get(&"slow".into()).unwrap();
    let other = registry.get(&"other".into()).unwrap();
    assert_eq!(slow.config().cooldown(), Duration::from_secs(99));
    assert_eq!(other.config().cooldown(), Duration::from_secs(10));
    assert_eq!(slow.config().name(), "slow");
}

#[test]
fn full_registry_evicts_the_least_recently_used_idle_closed_breaker() {
    // Sixteen keys: each eviction batch is one breaker.
    let registry = sixteen_keys_held();
    registry.get(&"k00".into()).unwrap(); // used again: now the most recent
    registry.get(&"new".into()).unwrap();
    assert_eq!(registry.len(), 16);
    let held = keys(&registry);
    assert!(held.contains(&"k00".to_string()));
    assert!(
        !held.contains(&"k01".to_string()),
        "k01 was least recently used"
    );
    assert!(held.contains(&"new".to_string()));
}

#[test]
fn closed_breakers_with_failures_to_remember_are_evicted_last() {
    let registry = sixteen_keys_held();
    // The oldest key holds a failure streak: evict a newer, clean one.
    let calls = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(keyed(&registry, calls).oneshot(("k00".into(), true)))
        .unwrap_err();
    registry.get(&"new".into()).unwrap();
    let held = keys(&registry);
    assert!(
        held.contains(&"k00".to_string()),
        "its failure is remembered"
    );
    assert!(!held.contains(&"k01".to_string()));
}

#[tokio::test(start_paused = true)]
async fn open_breakers_are_never_evicted_and_a_full_registry_refuses_with_a_typed_error() {
    let registry = Registry::<String>::builder()
        .default_config(config(1))
        .max_keys(4)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = keyed(&registry, Arc::clone(&calls));
    for i in 0..4 {
        let _ = svc.clone().oneshot((format!("k{i}"), true)).await;
    }
    assert_eq!(registry.keys_in(State::Open).len(), 4);

    let err = svc
        .clone()
        .oneshot(("fresh".into(), false))
        .await
        .unwrap_err();
    let full = err.downcast_ref::<RegistryFull>().expect("RegistryFull");
    assert_eq!(full.max_keys(), 4);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the refused call was not made"
    );
    assert_eq!(registry.len(), 4);

    // Once one recovers (closed), room is made again.
    advance(Duration::from_secs(10)).await;
    svc.clone().oneshot(("k0".into(), false)).await.unwrap();
    svc.clone().oneshot(("fresh".into(), false)).await.unwrap();
    assert!(keys(&registry).contains(&"fresh".to_string()));
    assert!(!keys(&registry).contains(&"k0".to_string()));
}

#[test]
fn a_million_distinct_keys_stay_within_the_bound() {
    let registry = bounded(1_000);
    let mut most = 0;
    for i in 0..1_000_000u32 {
        registry.get(&i.to_string()).unwrap();
        most = most.max(registry.len());
    }
    assert!(most <= 1_000, "held {most} keys");
    assert!(registry.len() > 900, "evicts in batches, not all at once");
}

#[tokio::test(start_paused = true)]
async fn parent_trips_on_its_childrens_failures_while_each_child_stays_closed() {
    let registry = with_parents(3, "openai", 5);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = keyed(&registry, Arc::clone(&calls));
    for model in ["a", "b", "c", "d", "e"] {
        let _ = svc.clone().oneshot((format!("openai/{model}"), true)).await;
    }
    let parent = registry.get(&"openai".into()).unwrap();
    assert_eq!(parent.state(), State::Open);
    for model in ["a", "b", "c", "d", "e"] {
        let child = registry.get(&format!("openai/{model}")).unwrap();
        assert_eq!(child.state(), State::Closed, "one failure each");
    }

    // Every child is refused while its parent is open, and the error names it.
    let made = calls.load(Ordering::SeqCst);
    for model in ["a", "z"] {
        let err = svc
            .clone()
            .oneshot((format!("openai/{model}"), false))
            .await
            .unwrap_err();
        let open = CircuitOpen::find(err.as_ref()).expect("refused");
        assert_eq!(open.breaker(), "openai");
    }
    assert_eq!(calls.load(Ordering::SeqCst), made);
    // Another provider is untouched.
    svc.clone()
        .oneshot(("anthropic/x".into(), false))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_open_child_refuses_and_names_itself_while_its_parent_is_closed() {
    let registry = with_parents(1, "p", 100);
    let svc = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    let _ = svc.clone().oneshot(("p/sick".into(), true)).await;
    let err = svc
        .clone()
        .oneshot(("p/sick".into(), false))
        .await
        .unwrap_err();
    assert_eq!(CircuitOpen::find(err.as_ref()).unwrap().breaker(), "p/sick");
    svc.clone().oneshot(("p/well".into(), false)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_an_open_breaker_open_with_its_counts() {
    let registry = Registry::<String>::new(config(1));
    let svc = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    let _ = svc.clone().oneshot(("k".into(), true)).await;
    let before = registry.get(&"k".into()).unwrap().snapshot();
    assert_eq!(before.state, State::Open);

    registry.reload(config(50), [("k".to_string(), config(7))]);
    let after = registry.get(&"k".into()).unwrap().snapshot();
    assert_eq!(
        after.state,
        State::Open,
        "a reload never forgives an outage"
    );
    assert_eq!(after.retry_after, before.retry_after);
    assert_eq!(after.counts.failures, before.counts.failures);
    assert_eq!(after.counts.opened, 1);
    assert_eq!(
        registry.get(&"k".into()).unwrap().config().trip(),
        config(7).trip()
    );
}

#[tokio::test(start_paused = true)]
async fn snapshot_shows_what_the_request_path_did() {
    let registry = Registry::<String>::new(config(1));
    let svc = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    let _ = svc.clone().oneshot(("k".into(), true)).await;
    let _ = svc.clone().oneshot(("k".into(), false)).await; // refused
    svc.clone().oneshot(("j".into(), false)).await.unwrap();
    let snapshot: std::collections::HashMap<String, _> = registry.snapshot().into_iter().collect();
    let k = &snapshot["k"];
    assert_eq!(k.state, State::Open);
    assert_eq!(
        (k.counts.calls, k.counts.rejected, k.counts.failures),
        (1, 1, 1)
    );
    assert_eq!(k.retry_after, Some(Duration::from_secs(10)));
    assert_eq!(snapshot["j"].state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn group_isolates_and_restores_every_model_of_one_provider() {
    let registry = Registry::<String>::new(config(5));
    for key in ["openai/a", "openai/b", "anthropic/a"] {
        registry.get(&key.into()).unwrap();
    }
    let openai = registry.group(|key| key.starts_with("openai/"));
    assert_eq!(openai.force_open(None), 2);
    assert_eq!(registry.keys_in(State::ForcedOpen).len(), 2);
    assert_eq!(
        registry.get(&"anthropic/a".into()).unwrap().state(),
        State::Closed
    );
    assert_eq!(openai.restore(), 2);
    assert!(registry.keys_in(State::ForcedOpen).is_empty());
}

#[tokio::test(start_paused = true)]
async fn registry_subscribers_see_every_keys_transitions() {
    let registry = Registry::<String>::new(config(1));
    let mut events = registry.subscribe();
    let svc = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    let _ = svc.clone().oneshot(("a".into(), true)).await;
    let _ = svc.clone().oneshot(("b".into(), true)).await;
    let mut opened: Vec<String> = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|t| t.to == State::Open)
        .map(|t| t.breaker.to_string())
        .collect();
    opened.sort();
    assert_eq!(opened, ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn a_call_the_child_refuses_is_not_admitted_by_its_parent_either() {
    let registry = with_parents(1, "p", 100);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = keyed(&registry, Arc::clone(&calls));
    let _ = svc.clone().oneshot(("p/sick".into(), true)).await; // trips the child
    for _ in 0..3 {
        let _ = svc.clone().oneshot(("p/sick".into(), false)).await; // refused by it
    }
    let parent = registry.get(&"p".into()).unwrap().snapshot();
    assert_eq!(
        parent.counts.calls, 1,
        "only the call that reached the upstream"
    );
    assert_eq!(parent.counts.calls as usize, calls.load(Ordering::SeqCst));
    let child = registry.get(&"p/sick".into()).unwrap().snapshot();
    assert_eq!((child.counts.calls, child.counts.rejected), (1, 3));
}

// A service clone that calls a key again remembers its breakers and skips
// the registry; what it does must be what a lookup would have done.

/// Sends `(key, fail)` through `svc` itself (not a clone), as a connection
/// that serves request after request does.
async fn send(
    svc: &mut (impl tower::Service<(String, bool), Response = (), Error = BoxError> + Clone),
    key: &str,
    fail: bool,
) -> Result<(), BoxError> {
    svc.ready().await?.call((key.to_string(), fail)).await
}

#[tokio::test(start_paused = true)]
async fn a_clone_that_calls_a_key_again_counts_and_refuses_as_a_lookup_does() {
    let registry = with_parents(3, "p", 100);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = keyed(&registry, Arc::clone(&calls));
    for _ in 0..3 {
        assert!(send(&mut svc, "p/sick", true).await.is_err());
    }
    for _ in 0..4 {
        let err = send(&mut svc, "p/sick", false).await.unwrap_err();
        assert_eq!(CircuitOpen::find(err.as_ref()).unwrap().breaker(), "p/sick");
    }
    send(&mut svc, "p/well", false).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    let counts = |key: &str| {
        let c = registry.get(&key.to_string()).unwrap().snapshot().counts;
        (c.calls, c.rejected, c.failures)
    };
    assert_eq!(counts("p/sick"), (3, 4, 3));
    assert_eq!(counts("p"), (4, 0, 3), "every admitted call, once");
    drop(svc);
    assert_eq!(counts("p/sick"), (3, 4, 3), "kept when the clone goes");
    assert_eq!(counts("p"), (4, 0, 3));
}

#[tokio::test(start_paused = true)]
async fn an_open_parent_refuses_a_child_names_itself_and_the_refusal_counts_in_the_child() {
    let registry = with_parents(100, "p", 3);
    let mut svc = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    for _ in 0..3 {
        assert!(send(&mut svc, "p/a", true).await.is_err());
    }
    // A clone that remembers the key, then one made for a single request
    // (which looks it up).
    let err = send(&mut svc, "p/a", false).await.unwrap_err();
    assert_eq!(CircuitOpen::find(err.as_ref()).unwrap().breaker(), "p");
    let fresh = keyed(&registry, Arc::new(AtomicUsize::new(0)));
    let err = fresh.oneshot(("p/a".to_string(), false)).await.unwrap_err();
    assert_eq!(CircuitOpen::find(err.as_ref()).unwrap().breaker(), "p");

    let child = registry.get(&"p/a".into()).unwrap().snapshot();
    assert_eq!(child.state, State::Closed, "its own state is its own");
    assert_eq!(
        (child.counts.rejected, child.counts.rejected_by_parent),
        (2, 2),
        "the child's calls, refused by its parent"
    );
    let parent = registry.get(&"p".into()).unwrap().snapshot();
    assert_eq!(
        (parent.counts.rejected, parent.counts.rejected_by_parent),
        (2, 0)
    );
    drop(svc);
    let child = registry.get(&"p/a".into()).unwrap().snapshot();
    assert_eq!(
        child.counts.rejected_by_parent, 2,
        "kept when the clone goes"
    );
}

/// A keyed service over `registry` that has called `key` often enough to
/// remember it (missed twice, then found).
async fn remembering(
    registry: &Registry<String>,
    key: &str,
) -> impl tower::Service<(String, bool), Response = (), Error = BoxError> + Clone {
    let mut svc = keyed(registry, Arc::new(AtomicUsize::new(0)));
    for _ in 0..3 {
        send(&mut svc, key, false).await.unwrap();
    }
    svc
}

/// Makes the breakers of `k01` to `k{last}`, in order.
fn make_keys(registry: &Registry<String>, last: usize) {
    for i in 1..=last {
        registry.get(&format!("k{i:02}")).unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_evicted_while_remembered_is_looked_up_again() {
    let registry = bounded(16);
    let mut svc = remembering(&registry, "k00").await;
    make_keys(&registry, 15);
    // Full: the least recently used, `k00`, makes room.
    registry.get(&"new".into()).unwrap();
    assert!(!keys(&registry).contains(&"k00".to_string()));

    assert!(send(&mut svc, "k00", true).await.is_err());
    let k00 = registry.get(&"k00".into()).unwrap().snapshot();
    assert_eq!(
        (k00.counts.calls, k00.counts.failures),
        (1, 1),
        "the call went to the breaker the registry holds now"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_used_through_a_clones_memory_stays_recently_used() {
    // 32 keys; a full registry evicts two at a time.
    let registry = bounded(32);
    let mut svc = remembering(&registry, "hot").await;
    make_keys(&registry, 30);
    // Only the clone's memory sees this use; the registry is not asked.
    send(&mut svc, "hot", false).await.unwrap();
    registry.get(&"k31".into()).unwrap();
    registry.get(&"k32".into()).unwrap();
    let held = keys(&registry);
    assert!(held.contains(&"hot".to_string()), "{held:?}");
    assert!(!held.contains(&"k01".to_string()), "{held:?}");
    assert!(!held.contains(&"k02".to_string()), "{held:?}");
    assert_eq!(held.len(), 31);
}

#[tokio::test(start_paused = true)]
async fn a_call_in_flight_when_its_breaker_is_evicted_counts_in_the_keys_breaker_now() {
    let registry = Registry::<String>::builder()
        .default_config(config(1))
        .max_keys(16)
        .build();
    let slow = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), |req: &(String, bool)| {
            req.0.clone()
        }))
        .service(service_fn(|(_, fail): (String, bool)| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            if fail {
                Err(BoxError::from("timed out"))
            } else {
                Ok(())
            }
        }));
    let in_flight = tokio::spawn(slow.oneshot(("k00".to_string(), true)));
    tokio::task::yield_now().await;
    assert_eq!(
        registry.get(&"k00".into()).unwrap().snapshot().counts.calls,
        1
    );

    // Full: `k00`, the least recently used and still closed, makes room.
    make_keys(&registry, 15);
    registry.get(&"new".into()).unwrap();
    assert!(!keys(&registry).contains(&"k00".to_string()));

    advance(Duration::from_secs(30)).await;
    assert!(in_flight.await.unwrap().is_err());
    let k00 = registry.get(&"k00".into()).unwrap();
    assert_eq!(k00.state(), State::Open, "the failure counted for the key");
    assert_eq!(k00.snapshot().counts.failures, 1);
}

#[test]
fn a_breaker_in_shadow_mode_is_never_evicted() {
    let registry = bounded(16);
    registry.get(&"k00".into()).unwrap().set_shadow(true);
    make_keys(&registry, 15);
    // Full: `k00` is the least recently used, but a new breaker for its
    // key would not be in shadow mode; `k01` makes room.
    registry.get(&"new".into()).unwrap();
    let held = keys(&registry);
    assert!(held.contains(&"k00".to_string()), "{held:?}");
    assert!(!held.contains(&"k01".to_string()), "{held:?}");
}

#[test]
fn concurrent_insertions_never_hold_more_than_max_keys() {
    for round in 0..200 {
        let registry = bounded(4);
        let threads = 8;
        let barrier = std::sync::Barrier::new(threads);
        let most_held = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let (registry, barrier, most_held) = (&registry, &barrier, &most_held);
                scope.spawn(move || {
                    barrier.wait();
                    for i in 0..4 {
                        let _ = registry.get(&format!("{round}-{thread}-{i}"));
                        most_held.fetch_max(registry.len(), std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        let held = registry.breakers().len();
        assert!(held <= 4, "round {round}: {held} breakers held");
        assert_eq!(held, registry.len(), "round {round}: the count agrees");
        let most = most_held.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most <= 4, "round {round}: {most} keys counted at once");
    }
}

/// A service built on a handle from `get` keeps protecting its key however
/// many other keys come and go: the handle holds its breaker in the
/// registry.
#[tokio::test(start_paused = true)]
async fn a_service_on_a_handle_from_get_keeps_protecting_after_other_keys_fill_the_registry() {
    let registry = Registry::<String>::builder()
        .default_config(config(2))
        .max_keys(4)
        .build();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let dead = tower::service_fn(move |_: ()| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Err::<(), BoxError>("upstream down".into()) }
    });
    let handle = registry.get(&"provider".to_string()).unwrap();
    let svc = CircuitBreaker::new(dead, &handle);
    drop(handle);
    make_keys(&registry, 40); // far more keys than the bound

    for _ in 0..10 {
        let _ = svc.clone().oneshot(()).await;
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "two failures trip it; the other eight are refused"
    );
    let held = registry.get(&"provider".to_string()).unwrap();
    assert_eq!(held.state(), State::Open, "the registry holds that breaker");
    assert!(registry.len() <= 4);
}

#[test]
fn breakers_held_by_users_are_not_evicted_and_a_registry_of_held_breakers_is_full() {
    let registry = bounded(2);
    let a = registry.get(&"a".to_string()).unwrap();
    let b = registry.get(&"b".to_string()).unwrap();
    let full = registry.get(&"c".to_string()).unwrap_err();
    assert_eq!(full.max_keys(), 2);
    assert!(a.ptr_eq(&registry.get(&"a".to_string()).unwrap()));
    drop(a);
    registry
        .get(&"c".to_string())
        .expect("`a` is no longer held");
    assert_eq!(keys(&registry), ["b", "c"]);
    assert!(b.ptr_eq(&registry.get(&"b".to_string()).unwrap()));
}

#[tokio::test(start_paused = true)]
async fn a_keyed_call_dropped_before_its_answer_counts_as_cancelled_in_the_key_and_its_parent() {
    let registry = with_parents(1, "a", 1);
    let svc = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), |req: &String| {
            req.clone()
        }))
        .service(service_fn(|_: String| {
            std::future::pending::<Result<(), BoxError>>()
        }));
    let call = tokio::spawn(svc.oneshot("a/b".to_string()));
    tokio::task::yield_now().await;
    call.abort(); // e.g. a timeout outside the breaker
    assert!(call.await.unwrap_err().is_cancelled());
    for key in ["a/b", "a"] {
        let counts = registry.get(&key.to_string()).unwrap().snapshot().counts;
        assert_eq!(
            (counts.calls, counts.cancelled, counts.failures),
            (1, 1, 0),
            "{key}"
        );
    }
}
