//! Paused tokio time outside `#[tokio::test]`, and the property-test
//! settings the test binaries share.
//!
//! Each binary uses a part, hence the `dead_code` allowance.
#![allow(dead_code)]

use proptest::test_runner::Config as ProptestConfig;

/// A current-thread runtime whose clock starts paused: time moves only
/// when every task waits (or by `tokio::time::advance`).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a paused runtime")
}

/// Property-test settings: `default_cases` cases unless `PROPTEST_CASES`
/// says otherwise, and failures printed (minimal case) rather than written
/// to `tests/`.
pub fn proptest_config(default_cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default_cases;
    }
    config
}
