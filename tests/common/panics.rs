//! Upstream panics a test scripts on purpose, kept out of the test output.

use std::sync::Once;

/// The message of every scripted upstream panic.
pub const SCRIPTED_PANIC: &str = "scripted upstream panic";

/// Keeps the scripted panics out of the test output; other panics (a
/// failed assertion) are reported as usual.
pub fn quiet_scripted_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if message != Some(SCRIPTED_PANIC) {
                default(info);
            }
        }));
    });
}
