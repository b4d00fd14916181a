//! The fleet conformance suite (`tests/common/fleet_conformance.rs`) on a
//! real `redis-server` on a free loopback port, real time: the scenarios
//! the memory fleet runs on paused time in
//! `tests/in_process/fleet_memory.rs`, under the same names. Each fleet
//! has a key prefix of its own on the one server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::fleet_conformance::Backend;
use crate::common::redis::RedisServer;
use tower_circuit_breaker::store::redis::RedisStore;
use tower_circuit_breaker::store::Fleet;

struct Redis {
    server: RedisServer,
    fleets: AtomicUsize,
}

impl Backend for Redis {
    fn fleet(&self, quorum: u32) -> Box<dyn Fn() -> Fleet + '_> {
        let prefix = format!("conformance{}", self.fleets.fetch_add(1, Ordering::Relaxed));
        Box::new(move || {
            let store = RedisStore::builder(self.server.url())
                .prefix(prefix.clone())
                .quorum(quorum)
                .refresh_interval(Duration::from_millis(200))
                .probe_lease(Duration::from_millis(800))
                .hold(Duration::from_millis(1300))
                .command_timeout(Duration::from_millis(200))
                .build()
                .expect("a valid store");
            Fleet::from(store)
        })
    }
}

fn redis() -> Redis {
    Redis {
        server: RedisServer::start(),
        fleets: AtomicUsize::new(0),
    }
}

crate::common::fleet_conformance::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    redis()
);
