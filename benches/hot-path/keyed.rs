//! Keyed calls as the registry grows: registries of 10, 1,000 and 100,000
//! keys, every breaker made beforehand, each called by an async caller
//! (`svc.ready().await?.call(req).await`) through one keyed service, in
//! three patterns:
//!
//! * `hot`: four keys in turn, which the service remembers (a connection
//!   calling a handful of providers): no registry lookup;
//! * `cycled`: every key in turn, so that no key comes back while the
//!   service still remembers it: the registry's lookup on every call, and
//!   the breakers' memory cold once there are more of them than the caches
//!   hold;
//! * `random`: a key drawn per call, uniformly, by a counter-based
//!   generator (splitmix64 of the call's number, a few multiplications):
//!   what a gateway in front of many tenants sees.
//!
//! Keys are `u64`s computed from the request by a function of a few
//! instructions, so nothing is formatted or hashed by the bench itself
//! while timed; the registry hashes them as it hashes any key.

use tower::Layer;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};

use crate::scenario::{Caller, Scenario};
use crate::services::{expect_served, inner, registry_of};

/// The rows at 10, 1,000 and 100,000 keys.
pub fn growth() -> Vec<Scenario> {
    let mut rows = at::<10>("10_keys");
    rows.extend(at::<1_000>("1k_keys"));
    rows.extend(at::<100_000>("100k_keys"));
    rows
}

/// The three patterns over a registry of `KEYS` keys.
fn at<const KEYS: u64>(label: &str) -> Vec<Scenario> {
    let registry = registry_of(KEYS);
    vec![
        row(&registry, KEYS, format!("keyed/{label}/hot"), hot),
        row(
            &registry,
            KEYS,
            format!("keyed/{label}/cycled"),
            cycled::<KEYS>,
        ),
        row(
            &registry,
            KEYS,
            format!("keyed/{label}/random"),
            random::<KEYS>,
        ),
    ]
}

/// A keyed service over `registry`, keying call `i` with `key_of(i)`,
/// checked to serve a call; the registry must hold `keys` keys before and
/// after every run (none evicted, none added).
fn row<F>(registry: &Registry<u64>, keys: u64, name: String, key_of: F) -> Scenario
where
    F: Fn(&u64) -> u64 + Clone + 'static,
{
    let caller = Caller::Async;
    let full = format!("{}{name}", caller.prefix());
    let mut svc = KeyedLayer::new(registry.clone(), key_of).layer(inner());
    expect_served(&full, &mut svc);
    let registry = registry.clone();
    let check = move |when: &str| {
        assert_eq!(
            registry.len() as u64,
            keys,
            "{full}: keys in the registry {when} a run"
        );
    };
    Scenario::new(caller, &name, svc, check)
        .over("bare")
        .versus("closed/consecutive")
}

/// Four keys in turn.
fn hot(req: &u64) -> u64 {
    req % 4
}

/// Every key in turn: a division by a constant, which compiles to a
/// multiplication.
fn cycled<const KEYS: u64>(req: &u64) -> u64 {
    req % KEYS
}

/// A key drawn uniformly from `0..KEYS`: the output of splitmix64 (seed 0)
/// for the call's number, scaled by a multiplication rather than a
/// division.
fn random<const KEYS: u64>(req: &u64) -> u64 {
    let mut z = req.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((u128::from(z) * u128::from(KEYS)) >> 64) as u64
}
