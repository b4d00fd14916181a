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
//!
//! The `cycled` and `random` rows are compared with the keyed floor's
//! (`floor/keyed/*`, see the `floor` module) over the same keys in the
//! same pattern: a lookup among many keys misses the cache on the table
//! and on the breaker whatever the breaker does, and the floor says how
//! much of a row's cost those misses are on the machine that runs it. The
//! `hot` rows are compared with a single breaker (`closed/consecutive`).

use tower::Layer;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};

use crate::floor::KeyedFloor;
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
    let cycled_floor = format!("floor/keyed/{label}/cycled");
    let random_floor = format!("floor/keyed/{label}/random");
    vec![
        row(&registry, KEYS, format!("keyed/{label}/hot"), hot).versus("closed/consecutive"),
        row(
            &registry,
            KEYS,
            format!("keyed/{label}/cycled"),
            cycled::<KEYS>,
        )
        .versus(&cycled_floor),
        row(
            &registry,
            KEYS,
            format!("keyed/{label}/random"),
            random::<KEYS>,
        )
        .versus(&random_floor),
        floor_row(KEYS, cycled_floor, cycled::<KEYS>),
        floor_row(KEYS, random_floor, random::<KEYS>),
    ]
}

/// The keyed floor over `keys` keys, keying call `i` with `key_of(i)`,
/// checked to serve a call.
fn floor_row<F>(keys: u64, name: String, key_of: F) -> Scenario
where
    F: Fn(&u64) -> u64 + Clone + 'static,
{
    let caller = Caller::Async;
    let full = format!("{}{name}", caller.prefix());
    let mut floor = KeyedFloor::new(inner(), keys, key_of);
    expect_served(&full, &mut floor);
    let check = floor.check(&full, keys);
    Scenario::new(caller, &name, floor, check).over("bare")
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
    Scenario::new(caller, &name, svc, check).over("bare")
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
