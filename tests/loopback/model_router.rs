//! The model-router demo's scenario (`examples/router/src/scenario.rs`,
//! which `cargo run --release -p model-router` runs), over the same real
//! hyper servers and clients on loopback, and its headline checked: with
//! the breakers, the requests that wait out the timeout and the calls the
//! sick providers receive fall to a fraction, probes look again, and the
//! all-out answer is an immediate 503; the README's gateway section is the
//! demo's wiring. Real sockets, so real time (about 8 s); the assertions
//! are on counts, never on timings.
#![cfg(feature = "http-body")]

use crate::scenario::{self, Answer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breakers_turn_the_outages_into_a_constant_cost() {
    // As many conversations as the demo runs: its figures are these.
    let conversations = 24;
    let (without, with) = scenario::run(conversations).await;

    assert!(
        without.waited() > 0 && without.sick_received > 0,
        "{without:?}"
    );
    // The cost is constant: each onset of a hang at alpha (its large
    // model, then the whole provider) costs at most the requests in flight
    // to it when it began, one per conversation; after that only probes
    // wait. Whether the second onset costs anything is a race: it is free
    // when the provider's breaker is open at that moment (its probe was
    // the large model's, still hanging), and costs a request per
    // conversation when the small model's successes closed it just before.
    let bound = 2 * conversations + with.probes as usize;
    assert!(
        with.waited() <= bound,
        "waits with the breakers: {}, more than {bound}",
        with.waited()
    );
    // Without them, every call to a sick model waits, all outage long.
    assert!(
        with.waited() * 2 < without.waited(),
        "waits: {} with the breakers, {} without",
        with.waited(),
        without.waited()
    );
    assert!(
        with.sick_received * 2 < without.sick_received,
        "calls the sick provider received: {} with the breakers, {} without",
        with.sick_received,
        without.sick_received
    );
    assert_eq!(without.probes, 0, "disabled breakers probe nothing");
    assert!(with.probes > 0, "the breakers looked again");
    assert!(with.count(Answer::AllOut) > 0, "every provider out: a 503");
    // A stream that froze held its client until it gave up, without the
    // breakers; with them it ended at its breaker's idle limit, an error
    // the client had at once.
    assert!(without.given_up() > 0, "frozen streams held their clients");
    assert_eq!(with.given_up(), 0, "no client held by a frozen stream");
    // After the outages, every model streams again through its breakers.
    let last = with.samples.last().expect("requests were made");
    assert_eq!(last.answer, Answer::Streamed, "{last:?}");
}

/// The code block of the Markdown page `page` that follows `marker`, a
/// comment naming the file it shows.
pub(crate) fn shown_block(page: &'static str, marker: &str) -> &'static str {
    let start = page.find(marker).expect("the page's section");
    page[start..]
        .split_once("```rust,ignore\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(code, _)| code)
        .expect("the section's code block")
}

#[test]
fn the_readmes_gateway_section_is_the_demos_wiring() {
    let wiring = include_str!("../../examples/router/src/gateway.rs");
    let readme = include_str!("../../README.md");
    let marker = "<!-- the model router's wiring: examples/router/src/gateway.rs -->";
    let code = shown_block(readme, marker);
    assert_eq!(code, wiring, "the README shows src/gateway.rs as it is");
}
