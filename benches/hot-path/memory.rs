//! The memory report: the sizes of what a caller holds and moves (the
//! service, its response future, the caller's own future, the results),
//! and the heap a breaker, a service, a clone and a registry's keys hold.
//!
//! Heap is counted by the bench's allocator ([`counting`]) on the thread
//! that builds: bytes asked for minus bytes handed back while building, the
//! thing built still alive. Sizes are those requested; the allocator's own
//! rounding and bookkeeping come on top.

use std::fmt;
use std::mem::{size_of, size_of_val};
use std::task::Context;
use std::time::Duration;

use tower::{BoxError, Layer, Service};
use tower_circuit_breaker::policy::{Adaptive, CountWindow, SlowCalls, TimeWindow, TripPolicy};
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config};
use tower_resilience_circuitbreaker::CircuitBreakerError;

use crate::alloc::counting;
use crate::callers::{complete, oneshot_call, ready_call};
use crate::driver::noop_waker;
use crate::peers::{
    failsafe_breaker, failsafe_time_window, recloser_breaker, resilience_layer, Failsafe, Recloser,
};
use crate::services::{inner, inner_boxed, BenchError, COOLDOWN};

/// Calls a clone makes before what it holds is counted again.
const CALLS: u64 = 1_000;

/// Prints the report; the registry row holds `registry_keys` keys.
pub fn report(registry_keys: usize) {
    sizes();
    heap();
    registry(registry_keys);
}

/// `size_of` the service, its response future, the future of an async
/// caller awaiting a call ([`ready_call`]), and that of one making a
/// request through a fresh clone ([`oneshot_call`]).
fn sizes_of<S: Service<u64> + Clone>(mut svc: S) -> [usize; 4] {
    let caller = size_of_val(&ready_call(&mut svc, 0));
    let oneshot = size_of_val(&oneshot_call(&svc, 0));
    [size_of::<S>(), size_of::<S::Future>(), caller, oneshot]
}

fn sizes() {
    let breaker = Breaker::new(Config::default());
    let registry = Registry::<u64>::new(Config::default());
    let (resilience, _handle) = resilience_layer(5, COOLDOWN);
    let rows = [
        ("bare, typed error", sizes_of(inner())),
        (
            "tower-circuit-breaker, typed error",
            sizes_of(CircuitBreaker::new(inner(), &breaker)),
        ),
        ("bare, BoxError", sizes_of(inner_boxed())),
        (
            "tower-circuit-breaker, BoxError",
            sizes_of(CircuitBreaker::new(inner_boxed(), &breaker)),
        ),
        (
            "keyed, typed error",
            sizes_of(KeyedLayer::new(registry, |req: &u64| req % 4).layer(inner())),
        ),
        (
            "tower-resilience, typed error",
            sizes_of(resilience.layer(inner())),
        ),
        (
            "failsafe, typed error",
            sizes_of(Failsafe {
                inner: inner(),
                breaker: failsafe_breaker(5, COOLDOWN),
            }),
        ),
        (
            "recloser, typed error",
            sizes_of(Recloser {
                inner: inner(),
                breaker: recloser_breaker(),
            }),
        ),
    ];
    println!();
    println!("memory: size_of, bytes (the typed error is an enum holding a CircuitOpen)");
    println!(
        "{:<36} {:>8} {:>16} {:>14} {:>15}",
        "service", "service", "response future", "async caller", "oneshot caller"
    );
    for (name, [service, future, caller, oneshot]) in rows {
        println!("{name:<36} {service:>8} {future:>16} {caller:>14} {oneshot:>15}");
    }
    println!(
        "CircuitOpen {}; the typed error {}; Result<u64, typed error> {}; Result<u64, BoxError> {}; \
         with the typed error inside: tower-resilience's Result {}, failsafe's {}, recloser's {}",
        size_of::<CircuitOpen>(),
        size_of::<BenchError>(),
        size_of::<Result<u64, BenchError>>(),
        size_of::<Result<u64, BoxError>>(),
        size_of::<Result<u64, CircuitBreakerError<BenchError>>>(),
        size_of::<Result<u64, failsafe::Error<BenchError>>>(),
        size_of::<Result<u64, recloser::Error<BenchError>>>(),
    );
}

/// Heap held by one breaker, the first service made from it, a clone of
/// that service, and a clone that has made [`CALLS`] calls (with anything
/// its calls left behind).
struct Heap {
    breaker: i64,
    service: Option<i64>,
    clone: Option<i64>,
    used_clone: Option<i64>,
}

/// `breaker` bytes for what was built (`made`), then the service
/// `service` makes from it, a clone, and a clone after calls.
fn with_service<M, S>(breaker: i64, made: &M, service: impl FnOnce(&M) -> S) -> Heap
where
    S: Service<u64, Response = u64> + Clone,
    S::Error: fmt::Debug,
{
    let (svc, service_heap) = counting(|| service(made));
    let (clone, clone_heap) = counting(|| svc.clone());
    let (used, used_heap) = counting(|| {
        let mut used = svc.clone();
        let mut cx = Context::from_waker(noop_waker());
        for i in 0..CALLS {
            let served = complete(&mut cx, ready_call(&mut used, i));
            assert!(served.is_ok(), "memory: a call was not served");
        }
        used
    });
    drop((used, clone, svc));
    Heap {
        breaker,
        service: Some(service_heap.retained()),
        clone: Some(clone_heap.retained()),
        used_clone: Some(used_heap.retained()),
    }
}

/// This crate: a breaker and its layer built from a config with `policy`
/// (and every other setting at its default), then its services.
fn ours(policy: impl FnOnce() -> Option<TripPolicy>) -> Heap {
    let (layer, built) = counting(|| {
        let config = match policy() {
            Some(policy) => Config::builder().trip(policy).build(),
            None => Ok(Config::default()),
        };
        CircuitBreakerLayer::new(config.expect("valid benchmark config"))
    });
    with_service(built.retained(), &layer, |layer| layer.layer(inner()))
}

fn heap() {
    let window = Duration::from_secs(10);
    let mut rows: Vec<(&str, Heap)> = vec![
        (
            "tower-circuit-breaker, consecutive (default)",
            ours(|| None),
        ),
        (
            "tower-circuit-breaker, count window 5 of 20",
            ours(|| Some(CountWindow::new(5, 20).into())),
        ),
        (
            "tower-circuit-breaker, time window 10 s",
            ours(|| Some(TimeWindow::new(window).into())),
        ),
        (
            "tower-circuit-breaker, slow calls over 1 s",
            ours(|| Some(SlowCalls::new(Duration::from_secs(1)).into())),
        ),
        (
            "tower-circuit-breaker, adaptive",
            ours(|| Some(Adaptive::new().into())),
        ),
    ];

    let (layer, built) = counting(|| resilience_layer(5, COOLDOWN));
    rows.push((
        "tower-resilience, 5 consecutive",
        with_service(built.retained(), &layer, |(layer, _)| layer.layer(inner())),
    ));
    let (breaker, built) = counting(|| failsafe_breaker(5, COOLDOWN));
    rows.push((
        "failsafe, 5 consecutive",
        with_service(built.retained(), &breaker, |breaker| Failsafe {
            inner: inner(),
            breaker: breaker.clone(),
        }),
    ));
    let (time_window, built) = counting(failsafe_time_window);
    rows.push((
        "failsafe, success rate over 10 s",
        Heap {
            breaker: built.retained(),
            service: None,
            clone: None,
            used_clone: None,
        },
    ));
    drop(time_window);
    let (breaker, built) = counting(recloser_breaker);
    rows.push((
        "recloser, default (ring of 100)",
        with_service(built.retained(), &breaker, |breaker| Recloser {
            inner: inner(),
            breaker: breaker.clone(),
        }),
    ));

    println!();
    println!("memory: heap retained, bytes (asked for minus handed back, the thing built alive)");
    println!(
        "{:<46} {:>16} {:>14} {:>8} {:>22}",
        "breaker",
        "breaker + layer",
        "first service",
        "a clone",
        format!("a clone, {CALLS} calls"),
    );
    let cell = |bytes: Option<i64>| bytes.map_or("-".to_string(), |b| b.to_string());
    for (name, heap) in rows {
        println!(
            "{name:<46} {:>16} {:>14} {:>8} {:>22}",
            heap.breaker,
            cell(heap.service),
            cell(heap.clone),
            cell(heap.used_clone),
        );
    }
}

/// A `Registry<String>` of `keys` keys of 12 bytes each, every breaker made
/// through `get` (default config): heap in all and per key.
fn registry(keys: usize) {
    let names: Vec<String> = (0..keys).map(|i| format!("key-{i:08}")).collect();
    let registry = Registry::<String>::builder()
        .default_config(Config::default())
        .max_keys(keys)
        .build();
    let ((), made) = counting(|| {
        for name in &names {
            registry.get(name).expect("room for every key");
        }
    });
    assert_eq!(registry.len(), keys, "memory: every key in the registry");
    let bytes = made.retained();
    println!(
        "Registry<String>, {keys} keys of 12 bytes made through get: {:.1} MB retained, {} bytes per key",
        bytes as f64 / 1e6,
        bytes / keys as i64,
    );
}
