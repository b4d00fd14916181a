//! The admin endpoint over loopback: real HTTP requests to an axum server
//! on 127.0.0.1 for every route, the event stream (live, filtered, a slow
//! client dropped), control off (404) and on, hostile names, 10,000
//! breakers paged on the server. The page as a browser renders it is
//! checked in `tests/admin_browser.rs`.
#![cfg(feature = "admin")]

use crate::common::admin as support;

use std::time::Duration;

use axum::Router;
use http::{Method, StatusCode};
use serde_json::Value;
use support::{encode, get, post, send, serve, Events};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::admin::{self, Admin};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Breaker, Config, State};

const HOSTILE: &str = "<img src=x onerror=alert(1)>";
const HOSTILE_ATTRIBUTE: &str = "\"><script>alert(2)</script>";

fn named(name: &str) -> Breaker {
    Breaker::new(Config::builder().name(name).build().unwrap())
}

fn provider_of(name: &str) -> Option<String> {
    name.split_once('/')
        .map(|(provider, _)| provider.to_string())
}

/// A registry of models under their providers: two failures in a row open
/// a model, ten its provider; open for a minute.
fn models() -> Registry<String> {
    let config = |name: &str, threshold| {
        Config::builder()
            .name(name)
            .trip(ConsecutiveFailures::new(threshold))
            .cooldown(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    Registry::builder()
        .default_config(config("default", 2))
        .config("openai".to_string(), config("openai", 10))
        .config("anthropic".to_string(), config("anthropic", 10))
        .parent(|key: &String| provider_of(key))
        .build()
}

/// Calls `model` through the registry's keyed layer; `fail` makes the
/// upstream fail.
async fn call(registry: &Registry<String>, model: &str, fail: bool) {
    let mut service = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), |req: &(String, bool)| {
            req.0.clone()
        }))
        .service(service_fn(|(_, fail): (String, bool)| async move {
            if fail {
                Err::<(), BoxError>("upstream down".into())
            } else {
                Ok(())
            }
        }));
    let _ = service
        .ready()
        .await
        .unwrap()
        .call((model.to_string(), fail))
        .await;
}

fn names(page: &Value) -> Vec<&str> {
    page["breakers"]
        .as_array()
        .expect("a list of breakers")
        .iter()
        .map(|b| b["name"].as_str().expect("a name"))
        .collect()
}

#[tokio::test]
async fn breakers_are_listed_with_state_time_retry_after_policy_counts_and_parent() {
    let registry = models();
    call(&registry, "openai/mini", false).await;
    call(&registry, "openai/gpt-x", true).await;
    call(&registry, "openai/gpt-x", true).await;
    call(&registry, "anthropic/claude", true).await;
    call(&registry, "anthropic/claude", false).await;
    let addr = serve(Admin::new(registry.clone()).parent(provider_of).router()).await;

    let reply = get(addr, "/breakers").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "application/json");
    assert_eq!(reply.header("x-content-type-options"), "nosniff");
    assert_eq!(reply.header("cache-control"), "no-store");
    let page = reply.json();
    assert_eq!(
        (page["total"].as_u64(), page["matched"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(
        (page["offset"].as_u64(), page["limit"].as_u64()),
        (Some(0), Some(100))
    );
    assert_eq!(page["control"], false);
    assert_eq!(page["states"]["open"], 1);
    assert_eq!(page["states"]["closed"], 4);
    assert_eq!(
        names(&page),
        [
            "openai/gpt-x",
            "anthropic",
            "anthropic/claude",
            "openai",
            "openai/mini"
        ],
        "open first, then by name"
    );

    let gpt_x = &page["breakers"][0];
    assert_eq!(gpt_x["state"], "open");
    let retry_after = gpt_x["retry_after_ms"]
        .as_u64()
        .expect("open: a retry-after");
    assert!(retry_after > 0 && retry_after <= 60_000, "{retry_after}");
    assert!(gpt_x["time_in_state_ms"].is_u64());
    assert_eq!(gpt_x["policy"]["policy"], "consecutive_failures");
    assert_eq!(gpt_x["policy"]["threshold"], 2);
    assert_eq!(gpt_x["last_trip"]["policy"], "consecutive_failures");
    assert_eq!(gpt_x["counts"]["failures"], 2);
    assert_eq!(gpt_x["counts"]["calls"], 2);
    assert_eq!(gpt_x["parent"], "openai");
    assert_eq!(gpt_x["failure_rate"], 1.0);

    let claude = &page["breakers"][2];
    assert_eq!(claude["state"], "closed");
    assert_eq!(claude["retry_after_ms"], Value::Null);
    assert_eq!(claude["failure_rate"], 0.5);
    assert_eq!(claude["parent"], "anthropic");
    let openai = &page["breakers"][3];
    assert_eq!(openai["parent"], Value::Null);
    assert_eq!(
        openai["counts"]["failures"], 2,
        "the models' failures count in their provider"
    );
}

/// Over a registry with a parent function, the admin names each
/// breaker's parent without being told how; `Admin::parent` replaces it.
#[tokio::test]
async fn a_registrys_own_parent_function_names_the_parents() {
    let registry = models();
    call(&registry, "openai/mini", false).await;
    call(&registry, "anthropic/claude", false).await;
    let addr = serve(admin::router(registry.clone())).await;
    let parents = |page: &Value| -> Vec<(String, Value)> {
        page["breakers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["name"].as_str().unwrap().to_string(), b["parent"].clone()))
            .collect()
    };
    let page = get(addr, "/breakers?sort=name").await.json();
    assert_eq!(
        parents(&page),
        [
            ("anthropic".to_string(), Value::Null),
            ("anthropic/claude".to_string(), "anthropic".into()),
            ("openai".to_string(), Value::Null),
            ("openai/mini".to_string(), "openai".into()),
        ]
    );
    let one = get(addr, &format!("/breakers/{}", encode("openai/mini")))
        .await
        .json();
    assert_eq!(one["parent"], "openai");

    let replaced = Admin::new(registry.clone()).parent(|_| Some("everyone".to_string()));
    let addr = serve(replaced.router()).await;
    let one = get(addr, &format!("/breakers/{}", encode("openai/mini")))
        .await
        .json();
    assert_eq!(one["parent"], "everyone");
}

/// A model whose provider is open is shown as held by it, its refusals
/// counted in its own row too.
#[tokio::test]
async fn a_model_under_an_open_provider_is_shown_held_with_its_refusals() {
    let registry = models();
    call(&registry, "openai/mini", false).await;
    call(&registry, "anthropic/claude", false).await;
    registry
        .get(&"openai".to_string())
        .unwrap()
        .force_open(Some(Duration::from_secs(60)));
    for _ in 0..3 {
        call(&registry, "openai/mini", false).await;
    }
    let addr = serve(admin::router(registry.clone())).await;
    let page = get(addr, "/breakers?sort=name").await.json();
    let row = |name: &str| -> Value {
        page["breakers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {name}"))
    };
    let mini = row("openai/mini");
    assert_eq!(mini["held_by_parent"], true);
    assert_eq!(mini["state"], "closed", "its own state is its own");
    assert_eq!(mini["counts"]["rejected"], 3);
    assert_eq!(mini["counts"]["rejected_by_parent"], 3);
    assert_eq!(row("openai")["counts"]["rejected"], 3);
    assert_eq!(row("anthropic/claude")["held_by_parent"], false);
    assert_eq!(row("openai")["held_by_parent"], false);
    let one = get(addr, &format!("/breakers/{}", encode("openai/mini")))
        .await
        .json();
    assert_eq!(one["held_by_parent"], true);
}

#[tokio::test]
async fn ten_thousand_breakers_are_filtered_and_paged_on_the_server() {
    let registry = Registry::<String>::builder().max_keys(10_000).build();
    let mut held = Vec::new();
    for i in 0..10_000 {
        let breaker = registry.get(&format!("model-{i:05}")).unwrap();
        if i % 1_000 == 7 {
            breaker.force_open(Some(Duration::from_secs(60)));
            held.push(breaker);
        }
    }
    let addr = serve(admin::router(registry.clone())).await;

    let reply = get(addr, "/breakers").await;
    let page = reply.json();
    assert_eq!(
        (page["total"].as_u64(), page["matched"].as_u64()),
        (Some(10_000), Some(10_000))
    );
    assert_eq!(
        page["breakers"].as_array().unwrap().len(),
        100,
        "a page, not everything"
    );
    assert!(
        reply.body.len() < 200_000,
        "{} bytes for 100 rows",
        reply.body.len()
    );
    assert_eq!(
        (
            page["states"]["open"].as_u64(),
            page["states"]["closed"].as_u64()
        ),
        (Some(10), Some(9_990))
    );
    let first: Vec<String> = (0..10)
        .map(|i| format!("model-{:05}", i * 1_000 + 7))
        .collect();
    assert_eq!(names(&page)[..10], first, "the open ones first");
    assert_eq!(names(&page)[10], "model-00000");

    let open = get(addr, "/breakers?state=open&offset=5&limit=5")
        .await
        .json();
    assert_eq!(open["matched"], 10);
    assert_eq!(names(&open), first[5..]);

    let prefix = get(addr, "/breakers?prefix=model-012&sort=name&limit=1000")
        .await
        .json();
    assert_eq!(prefix["matched"], 100);
    assert_eq!(prefix["states"]["closed"], 100);
    let expected: Vec<String> = (1_200..1_300).map(|i| format!("model-{i:05}")).collect();
    assert_eq!(names(&prefix), expected);

    let last = get(addr, "/breakers?sort=name&offset=9990&limit=1000")
        .await
        .json();
    let expected: Vec<String> = (9_990..10_000).map(|i| format!("model-{i:05}")).collect();
    assert_eq!(names(&last), expected);

    let several = get(addr, "/breakers?state=open,closed&prefix=model-0000")
        .await
        .json();
    assert_eq!(several["matched"], 10, "model-00000 to model-00009");
}

#[tokio::test]
async fn one_breaker_is_found_by_its_name_even_with_a_slash_and_others_are_404() {
    let registry = models();
    call(&registry, "openai/gpt-x", false).await;
    let addr = serve(Admin::new(registry).parent(provider_of).router()).await;

    let reply = get(addr, &format!("/breakers/{}", encode("openai/gpt-x"))).await;
    assert_eq!(reply.status, StatusCode::OK);
    let breaker = reply.json();
    assert_eq!(breaker["name"], "openai/gpt-x");
    assert_eq!(breaker["parent"], "openai");
    assert_eq!(breaker["counts"]["calls"], 1);

    let missing = get(addr, "/breakers/openai%2Fgpt-y").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json()["error"],
        "no breaker is named \"openai/gpt-y\""
    );
}

#[tokio::test]
async fn a_query_the_endpoint_cannot_read_is_a_400_naming_the_parameter() {
    let addr = serve(admin::router(named("search"))).await;
    for (query, needle) in [
        ("limit=0", "`limit` must be from 1 to 1000, not 0"),
        ("limit=lots", "`limit` must be a whole number, not \"lots\""),
        (
            "state=ajar",
            "`state` must be one of open, half_open, forced_open",
        ),
        ("sort=age", "`sort` must be `state` or `name`, not \"age\""),
        ("colour=red", "unknown field `colour`"),
    ] {
        let reply = get(addr, &format!("/breakers?{query}")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}");
        let error = reply.json()["error"].as_str().unwrap().to_string();
        assert!(error.contains(needle), "{query}: {error}");
    }
    let reply = get(addr, "/events?stat=open").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

/// On paused time the clock moves only when every task waits and a timer
/// is due: with keep-alives off the server has no timer, so the only one
/// is the test's 100 ms bound, and a stream that waited for anything but
/// the announcement (a polling loop, a batch) would let it run out.
#[tokio::test(start_paused = true)]
async fn a_transition_reaches_the_event_stream_within_100_ms() {
    let registry = Registry::<String>::new(Config::default());
    let breaker = registry.get(&"openai".to_string()).unwrap();
    let addr = serve(Admin::new(registry.clone()).keep_alive(None).router()).await;
    let mut events = Events::open(addr, "/events").await;
    assert_eq!(events.headers["cache-control"], "no-cache");
    let hello = events.next().await.expect("a first event");
    assert_eq!(
        hello.retry,
        Some(1_000),
        "browsers reconnect after a second"
    );

    breaker.force_open(None);
    let event = tokio::time::timeout(Duration::from_millis(100), events.next_event())
        .await
        .expect("no transition within 100 ms")
        .expect("the transition");
    assert_eq!(event.event.as_deref(), Some("transition"));
    let transition = event.json();
    assert_eq!(transition["breaker"], "openai");
    assert_eq!(
        (transition["from"].as_str(), transition["to"].as_str()),
        (Some("closed"), Some("forced_open"))
    );
    assert_eq!(transition["reason"]["policy"], "manual");

    // A key made after the stream opened is heard too: the registry's
    // channel carries every key's transitions.
    registry
        .get(&"anthropic".to_string())
        .unwrap()
        .force_open(Some(Duration::from_secs(30)));
    let transition = events
        .next_event()
        .await
        .expect("the next transition")
        .json();
    assert_eq!(
        (transition["breaker"].as_str(), transition["to"].as_str()),
        (Some("anthropic"), Some("open"))
    );
    assert_eq!(transition["retry_after_ms"], 30_000);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_stream_sends_a_keep_alive_comment() {
    let addr = serve(
        Admin::new(named("search"))
            .keep_alive(Some(Duration::from_secs(15)))
            .router(),
    )
    .await;
    let mut events = Events::open(addr, "/events").await;
    events.next().await.expect("a first event");
    let before = Instant::now();
    let quiet = events.next().await.expect("a keep-alive");
    assert_eq!(quiet.comments, ["keep-alive"]);
    assert_eq!(quiet.event, None);
    assert!(before.elapsed() >= Duration::from_secs(15));
}

#[tokio::test]
async fn events_keep_to_the_breakers_shown_and_to_the_prefix() {
    let alpha = named("alpha");
    let beta = named("beta");
    let outsider = named("outsider");
    let addr = serve(admin::router(vec![alpha.clone(), beta.clone()])).await;
    let mut every = Events::open(addr, "/events").await;
    let mut betas = Events::open(addr, "/events?prefix=be").await;
    every.next().await.unwrap();
    betas.next().await.unwrap();

    outsider.force_open(None);
    alpha.force_open(None);
    beta.disable();
    let first = every.next_event().await.unwrap().json();
    assert_eq!(
        first["breaker"], "alpha",
        "the outsider's transition is not shown"
    );
    assert_eq!(every.next_event().await.unwrap().json()["breaker"], "beta");
    let only = betas.next_event().await.unwrap().json();
    assert_eq!(
        (only["breaker"].as_str(), only["to"].as_str()),
        (Some("beta"), Some("disabled"))
    );
}

/// A breaker outside the set that shares a name with one in it: its
/// transitions are not the set's, and the page must not show them as if
/// they were.
#[tokio::test]
async fn events_of_a_set_leave_out_other_breakers_of_the_same_name() {
    let shown = named("openai");
    let namesake = named("openai");
    let addr = serve(admin::router(vec![shown.clone()])).await;
    let mut events = Events::open(addr, "/events").await;
    events.next().await.unwrap();

    namesake.force_open(None);
    shown.disable();
    let first = events.next_event().await.unwrap().json();
    assert_eq!(
        (first["breaker"].as_str(), first["to"].as_str()),
        (Some("openai"), Some("disabled")),
        "the namesake's forced opening is not the shown breaker's"
    );
}

/// A client that stops reading: the server's writes to it fill the
/// sockets' buffers, its stream is no longer polled and falls behind the
/// registry's channel. The breakers go on without waiting, a client that
/// reads keeps up, and the slow one, once it reads again, finds a `lagged`
/// event and the end of its stream.
#[tokio::test]
async fn a_slow_event_client_is_dropped_and_neither_the_breakers_nor_other_clients_wait() {
    // Long names make each event about 4 KiB. The slow client's receive
    // buffer is fixed at 256 KiB (Linux would grow it up to 32 MiB), so
    // that a few thousand events outgrow it, the server's send buffer (at
    // most 4 MiB) and hyper's own.
    let name = format!("provider-{}", "x".repeat(4_000));
    let registry = Registry::<String>::new(Config::default());
    let breaker = registry.get(&name).unwrap();
    let addr = serve(admin::router(registry.clone())).await;
    let mut slow = Events::open_with(addr, "/events", Some(256 * 1024)).await;
    slow.next().await.expect("a first event");
    let mut fast = Events::open(addr, "/events").await;
    fast.next().await.expect("a first event");

    const TRANSITIONS: usize = 3_000;
    for i in 0..TRANSITIONS {
        // `force_open` and `restore` are not async: they cannot wait for a
        // reader. The reading client sees each in turn.
        let to = if i % 2 == 0 {
            breaker.force_open(None);
            "forced_open"
        } else {
            breaker.restore();
            "closed"
        };
        let event = tokio::time::timeout(Duration::from_secs(30), fast.next_event())
            .await
            .unwrap_or_else(|_| panic!("the reading client got no event {i} in 30 s"))
            .expect("a live stream");
        assert_eq!(event.json()["to"], to, "event {i}");
    }

    let mut received = 0;
    let mut lagged = None;
    // Bounded, so that a stream that never says `lagged` fails the test
    // rather than hanging it.
    let patience = Duration::from_secs(60);
    while let Some(event) = tokio::time::timeout(patience, slow.next_event())
        .await
        .unwrap_or_else(|_| panic!("the slow client waited {patience:?} after {received} events"))
    {
        match event.event.as_deref() {
            Some("transition") => received += 1,
            Some("lagged") => {
                lagged = Some(event.json()["missed"].as_u64().expect("a count"));
                break;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    let missed = lagged.unwrap_or_else(|| panic!("no `lagged` event after {received} transitions"));
    assert!(
        missed > 0 && received < TRANSITIONS,
        "received {received}, missed {missed}"
    );
    let end = tokio::time::timeout(patience, slow.next())
        .await
        .expect("the slow client's stream ended or went on");
    assert!(end.is_none(), "the slow client's stream ended");

    // The endpoint serves on, and a new stream is live. (The breaker is
    // closed again: `force_open` makes a transition, `reset` would not.)
    let mut again = Events::open(addr, "/events").await;
    again.next().await.unwrap();
    breaker.force_open(None);
    let event = tokio::time::timeout(patience, again.next_event())
        .await
        .expect("a transition on the new stream")
        .expect("a live stream");
    assert_eq!(event.json()["breaker"], name);
}

const ACTIONS: [&str; 5] = ["force-open", "force-closed", "disable", "restore", "reset"];

#[tokio::test]
async fn control_routes_do_not_exist_unless_enabled() {
    let registry = models();
    let gpt_x = registry.get(&"openai/gpt-x".to_string()).unwrap();
    let addr = serve(admin::router(registry.clone())).await;
    for action in ACTIONS {
        for path in [
            format!("/breakers/openai%2Fgpt-x/{action}"),
            format!("/groups/openai/{action}"),
            format!("/control/{action}?breaker=openai%2Fgpt-x"),
        ] {
            let reply = post(addr, &path).await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        }
    }
    assert_eq!(gpt_x.state(), State::Closed);
    assert_eq!(get(addr, "/breakers").await.json()["control"], false);
    assert_eq!(get(addr, "/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn control_acts_on_one_breaker_and_on_groups_by_prefix() {
    let registry = models();
    let gpt_x = registry.get(&"openai/gpt-x".to_string()).unwrap();
    let mini = registry.get(&"openai/mini".to_string()).unwrap();
    let claude = registry.get(&"anthropic/claude".to_string()).unwrap();
    let addr = serve(Admin::new(registry.clone()).control(true).router()).await;
    assert_eq!(get(addr, "/breakers").await.json()["control"], true);

    let path = |action: &str| format!("/breakers/{}/{action}", encode("openai/gpt-x"));
    let done = post(addr, &path("force-open")).await;
    assert_eq!(done.status, StatusCode::OK);
    let done = done.json();
    assert_eq!(
        (done["action"].as_str(), done["changed"].as_bool()),
        (Some("force-open"), Some(true))
    );
    assert_eq!(done["breaker"]["state"], "forced_open");
    assert_eq!(gpt_x.state(), State::ForcedOpen);
    assert_eq!(
        post(addr, &path("force-open")).await.json()["changed"],
        false,
        "already held open"
    );

    for (action, state) in [
        ("restore", State::Closed),
        ("force-closed", State::ForcedClosed),
        ("disable", State::Disabled),
        ("reset", State::Closed),
    ] {
        let done = post(addr, &path(action)).await.json();
        assert_eq!(done["changed"], true, "{action}");
        assert_eq!(gpt_x.state(), state, "{action}");
    }
    let period = post(addr, &format!("{}?for=90s", path("force-open")))
        .await
        .json();
    assert_eq!(
        period["breaker"]["state"], "open",
        "open for a period, then it probes"
    );
    let retry_after = period["breaker"]["retry_after_ms"].as_u64().unwrap();
    assert!(
        retry_after > 60_000 && retry_after <= 90_000,
        "{retry_after}"
    );

    let group = post(addr, &format!("/groups/{}/force-open", encode("openai/"))).await;
    assert_eq!(group.status, StatusCode::OK);
    let group = group.json();
    assert_eq!(group["prefix"], "openai/");
    assert_eq!(
        (group["matched"].as_u64(), group["changed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (gpt_x.state(), mini.state(), claude.state()),
        (State::ForcedOpen, State::ForcedOpen, State::Closed)
    );
    let restored = post(addr, "/groups/openai/restore").await.json();
    assert_eq!(
        (restored["matched"].as_u64(), restored["changed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (gpt_x.state(), mini.state()),
        (State::Closed, State::Closed)
    );

    let unknown = post(addr, "/breakers/openai%2Fgpt-y/reset").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let action = post(addr, &path("explode")).await;
    assert_eq!(action.status, StatusCode::NOT_FOUND);
    assert!(action.json()["error"]
        .as_str()
        .unwrap()
        .contains("force-open, force-closed, disable, restore, reset"));
    let bad_period = post(addr, &format!("{}?for=soon", path("force-open"))).await;
    assert_eq!(bad_period.status, StatusCode::BAD_REQUEST);
    assert!(bad_period.json()["error"]
        .as_str()
        .unwrap()
        .starts_with("`for` must be a duration"));
    assert_eq!(
        get(addr, &path("reset")).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn control_refuses_requests_another_sites_page_makes_a_browser_send() {
    let breaker = named("openai");
    let addr = serve(Admin::new(breaker.clone()).control(true).router()).await;
    let host = addr.to_string();
    let same_origin = format!("http://{host}");
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "http://evil.example")],
    ] {
        let reply = send(addr, Method::POST, "/breakers/openai/force-open", &headers).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{headers:?}");
        assert_eq!(breaker.state(), State::Closed, "{headers:?}");
    }
    for headers in [
        vec![("sec-fetch-site", "same-origin")],
        vec![("origin", same_origin.as_str())],
        vec![],
    ] {
        let reply = send(addr, Method::POST, "/breakers/openai/restore", &headers).await;
        assert_eq!(reply.status, StatusCode::OK, "{headers:?}");
    }
}

/// DNS rebinding: a page on `attacker.example`, once that name resolves
/// to this machine, makes the browser send matching `Host`, `Origin` and
/// `Sec-Fetch-Site` headers. Every route refuses a host the admin is not
/// served under; loopback names always pass, others when named.
#[tokio::test]
async fn every_route_refuses_a_host_it_is_not_served_under() {
    let breaker = named("openai");
    let admin = || Admin::new(breaker.clone()).control(true);
    let addr = serve(admin().router()).await;
    let port = addr.port();
    let rebound = format!("attacker.example:{port}");
    let origin = format!("http://{rebound}");
    let as_attacker = [
        ("host", rebound.as_str()),
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    for (method, path) in [
        (Method::POST, "/breakers/openai/force-open"),
        (Method::POST, "/groups/open/force-open"),
        (Method::POST, "/control/force-open?breaker=openai"),
        (Method::GET, "/breakers"),
        (Method::GET, "/breakers/openai"),
        (Method::GET, "/events"),
        (Method::GET, "/"),
        (Method::GET, "/no-such-route"),
    ] {
        let reply = send(addr, method.clone(), path, &as_attacker).await;
        assert_eq!(
            reply.status,
            StatusCode::MISDIRECTED_REQUEST,
            "{method} {path}"
        );
        assert!(
            reply.json()["error"]
                .as_str()
                .unwrap()
                .contains("allowed_hosts"),
            "the refusal says what to do: {}",
            reply.body
        );
        assert!(
            !reply.body.contains("\"openai\""),
            "nothing of the breakers leaks"
        );
    }
    assert_eq!(breaker.state(), State::Closed, "no button was pressed");

    for host in [
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        addr.to_string(),
    ] {
        let reply = send(
            addr,
            Method::GET,
            "/breakers/openai",
            &[("host", host.as_str())],
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{host}");
    }

    let named_host = serve(admin().allowed_hosts(["gateway.internal"]).router()).await;
    let host = format!("gateway.internal:{}", named_host.port());
    let reply = send(
        named_host,
        Method::GET,
        "/breakers/openai",
        &[("host", host.as_str())],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "a named host is served");
    let reply = send(named_host, Method::GET, "/breakers/openai", &as_attacker).await;
    assert_eq!(
        reply.status,
        StatusCode::MISDIRECTED_REQUEST,
        "naming one host allows no other"
    );

    // Nested, as the docs show it: unknown paths under the prefix too.
    let nested = serve(Router::new().nest("/admin", admin().router())).await;
    let host = format!("attacker.example:{}", nested.port());
    for path in ["/admin", "/admin/breakers", "/admin/no-such-route"] {
        let reply = send(nested, Method::GET, path, &[("host", host.as_str())]).await;
        assert_eq!(
            reply.status,
            StatusCode::MISDIRECTED_REQUEST,
            "nested {path}"
        );
    }
    let unknown = get(nested, "/admin/no-such-route").await;
    assert_eq!(
        unknown.status,
        StatusCode::NOT_FOUND,
        "from loopback: no such route"
    );

    let any = serve(admin().allow_any_host().router()).await;
    let reply = send(
        any,
        Method::POST,
        "/breakers/openai/force-open",
        &as_attacker,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "behind a proxy that checks the name"
    );
    assert_eq!(breaker.state(), State::ForcedOpen);
}

/// The query form of the control routes: the name is not a path segment,
/// so a name such as `..` reaches the endpoint as it is.
#[tokio::test]
async fn control_by_query_acts_on_a_breaker_or_a_prefix_whatever_its_name() {
    let (dot_dot, child) = (named(".."), named("../child"));
    let addr = serve(
        Admin::new(vec![dot_dot.clone(), child.clone()])
            .control(true)
            .router(),
    )
    .await;
    let reply = post(addr, "/control/force-open?breaker=..&for=30s").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["breaker"]["name"], "..");
    assert_eq!(dot_dot.state(), State::Open);
    assert_eq!(child.state(), State::Closed);

    let reply = post(addr, "/control/disable?prefix=..").await;
    assert_eq!(
        (
            reply.json()["matched"].as_u64(),
            reply.json()["changed"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(child.state(), State::Disabled);

    for path in [
        "/control/reset",
        "/control/reset?breaker=..&prefix=..",
        "/control/reset?breaker=..&colour=red",
    ] {
        assert_eq!(
            post(addr, path).await.status,
            StatusCode::BAD_REQUEST,
            "{path}"
        );
    }
    assert_eq!(
        post(addr, "/control/explode?breaker=..").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(addr, "/control/reset?breaker=nobody").await.status,
        StatusCode::NOT_FOUND
    );
    let cross_site = send(
        addr,
        Method::POST,
        "/control/reset?breaker=..",
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(cross_site.status, StatusCode::FORBIDDEN);
}

/// A keep-alive interval of zero would send comments as fast as the
/// client reads: it is taken as one second.
#[tokio::test(start_paused = true)]
async fn a_keep_alive_under_a_second_is_sent_once_a_second() {
    let addr = serve(
        Admin::new(named("search"))
            .keep_alive(Some(Duration::ZERO))
            .router(),
    )
    .await;
    let mut events = Events::open(addr, "/events").await;
    events.next().await.expect("a first event");
    let before = Instant::now();
    for _ in 0..3 {
        let quiet = events.next().await.expect("a keep-alive");
        assert_eq!(quiet.comments, ["keep-alive"]);
    }
    assert!(
        before.elapsed() >= Duration::from_secs(3),
        "three comments took {:?}",
        before.elapsed()
    );
}

#[tokio::test]
async fn hostile_names_are_escaped_in_the_json_and_the_events() {
    let registry = Registry::<String>::new(Config::default());
    let img = registry.get(&HOSTILE.to_string()).unwrap();
    registry.get(&HOSTILE_ATTRIBUTE.to_string()).unwrap();
    let addr = serve(Admin::new(registry.clone()).control(true).router()).await;
    let mut events = Events::open(addr, "/events").await;
    events.next().await.unwrap();

    let reply = get(addr, "/breakers?sort=name").await;
    assert!(!reply.body.contains(['<', '>']), "{}", reply.body);
    assert!(reply
        .body
        .contains("\\u003cimg src=x onerror=alert(1)\\u003e"));
    assert_eq!(
        names(&reply.json()),
        [HOSTILE_ATTRIBUTE, HOSTILE],
        "the same names, read back"
    );

    let one = get(addr, &format!("/breakers/{}", encode(HOSTILE))).await;
    assert_eq!(one.status, StatusCode::OK);
    assert!(!one.body.contains('<'));
    assert_eq!(one.json()["name"], HOSTILE);

    let done = post(addr, &format!("/breakers/{}/force-open", encode(HOSTILE))).await;
    assert_eq!(done.status, StatusCode::OK);
    assert!(!done.body.contains('<'));
    assert_eq!(img.state(), State::ForcedOpen);

    let event = events.next_event().await.unwrap();
    assert!(!event.data.contains(['<', '>']), "{}", event.data);
    assert_eq!(event.json()["breaker"], HOSTILE);
}

#[tokio::test]
async fn the_page_is_one_self_contained_document_under_a_fresh_nonce() {
    let addr = serve(admin::router(named("search"))).await;
    let page = get(addr, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(page.header("x-frame-options"), "DENY");
    let policy = page.header("content-security-policy");
    let nonce = policy
        .split("script-src 'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("a script nonce");
    assert!(
        policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"),
        "{policy}"
    );
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert!(page.body.contains(&format!("<script nonce=\"{nonce}\">")));
    assert!(page.body.contains(&format!("<style nonce=\"{nonce}\">")));
    for elsewhere in ["http://", "https://", "//cdn", " src=", " href="] {
        assert!(
            !page.body.contains(elsewhere),
            "the page refers to {elsewhere:?}"
        );
    }
    let again = get(addr, "/").await;
    assert_ne!(
        again.header("content-security-policy"),
        policy,
        "a nonce per response"
    );
}

#[tokio::test]
async fn the_router_nests_under_any_path_in_a_router_with_state_of_its_own() {
    #[derive(Clone)]
    struct AppState;
    let breaker = named("search");
    let app: Router = Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .nest(
            "/ops/breakers",
            Admin::new(breaker.clone()).control(true).router(),
        )
        .with_state(AppState);
    let addr = serve(app).await;
    assert_eq!(
        get(addr, "/ops/breakers").await.header("content-type"),
        "text/html; charset=utf-8"
    );
    assert_eq!(
        names(&get(addr, "/ops/breakers/breakers").await.json()),
        ["search"]
    );
    assert_eq!(
        post(addr, "/ops/breakers/breakers/search/force-open")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(breaker.state(), State::ForcedOpen);
    assert_eq!(get(addr, "/health").await.body, "ok");
}

#[tokio::test]
async fn the_fleet_routes_exist_only_with_a_fleet_store_and_steer_only_with_control() {
    use tower_circuit_breaker::store::memory::MemoryFleet;
    let memory = MemoryFleet::builder().build().unwrap();
    let (here, there) = (memory.named_instance("gw-1"), memory.named_instance("gw-2"));
    let registry = |store: &tower_circuit_breaker::store::memory::MemoryStore| -> Registry<String> {
        Registry::builder()
            .default_config(Config::default())
            .store(store)
            .build()
    };
    let (ours, theirs) = (registry(&here), registry(&there));
    let (a, b) = (
        ours.get(&"openai".to_owned()).unwrap(),
        theirs.get(&"openai".to_owned()).unwrap(),
    );

    // No fleet store: no fleet routes.
    let plain = serve(Admin::new(ours.clone()).control(true).router()).await;
    assert_eq!(get(plain, "/fleet?breaker=openai").await.status, 404);
    assert_eq!(
        post(plain, "/fleet/force-open?breaker=openai").await.status,
        404
    );
    let listed = get(plain, "/breakers").await.json();
    assert_eq!(listed["fleet"], false);

    // A fleet store without control: the view, no steering.
    let viewing = serve(Admin::new(ours.clone()).fleet(&here).router()).await;
    assert_eq!(get(viewing, "/breakers").await.json()["fleet"], true);
    let view = get(viewing, "/fleet?breaker=openai").await;
    assert_eq!(view.status, 200, "{}", view.body);
    let view = view.json();
    assert_eq!(view["instance"], here.instance());
    assert!(view["instance"].as_str().unwrap().starts_with("gw-1/"));
    assert_eq!(view["fleet"]["state"], "closed");
    assert_eq!(view["local"]["state"], "closed");
    assert_eq!(
        post(viewing, "/fleet/force-open?breaker=openai")
            .await
            .status,
        404
    );
    assert_eq!(get(viewing, "/fleet").await.status, 400, "no name");
    assert_eq!(get(viewing, "/fleet?breaker=x&limit=3").await.status, 400);
    let unknown = get(viewing, "/fleet?breaker=nobody-here").await.json();
    assert_eq!(
        unknown["local"],
        Value::Null,
        "no local breaker of that name"
    );

    // With control: every instance's breaker of the name.
    let steering = serve(Admin::new(ours).fleet(&here).control(true).router()).await;
    let cross_site = send(
        steering,
        Method::POST,
        "/fleet/force-open?breaker=openai",
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(cross_site.status, StatusCode::FORBIDDEN);
    assert_eq!(
        b.state(),
        State::Closed,
        "a refused request changes nothing"
    );
    assert_eq!(
        post(steering, "/fleet/explode?breaker=openai").await.status,
        404
    );
    assert_eq!(
        post(steering, "/fleet/reset?breaker=openai&for=1s")
            .await
            .status,
        400
    );
    let done = post(steering, "/fleet/force-open?breaker=openai").await;
    assert_eq!(done.status, 200, "{}", done.body);
    let done = done.json();
    assert_eq!(done["action"], "force-open");
    assert_eq!(done["fleet"]["control"], "forced_open");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        (a.state(), b.state()),
        (State::ForcedOpen, State::ForcedOpen)
    );
    let restored = post(steering, "/fleet/restore?breaker=openai").await;
    assert_eq!(restored.status, 200, "{}", restored.body);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!((a.state(), b.state()), (State::Closed, State::Closed));
}
