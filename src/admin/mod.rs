//! An admin endpoint for the people on call (cargo feature `admin`): every
//! breaker as JSON, transitions as server-sent events, a live HTML page,
//! and, only when enabled, manual control, as an axum [`Router`] to nest
//! under any path.
//!
//! | route | answers |
//! | --- | --- |
//! | `GET /` | the live page: one self-contained HTML document (inline CSS and script, nothing fetched from elsewhere) |
//! | `GET /breakers` | a page of breakers as JSON, filtered and paged on the server (below) |
//! | `GET /breakers/{name}` | one breaker as JSON, or `404` |
//! | `GET /events` | transitions as server-sent events, live (`?prefix=` filters by name) |
//! | `POST /breakers/{name}/{action}` | manual control of one breaker: **only with [`Admin::control`]** |
//! | `POST /groups/{prefix}/{action}` | the same for every breaker whose name starts with `prefix`: **only with [`Admin::control`]** |
//! | `POST /control/{action}?breaker={name}` or `?prefix={prefix}` | the same two, the name in the query (any name, `.` and `..` included): **only with [`Admin::control`]** |
//! | `GET /fleet?breaker={name}` | the fleet's view of one name beside this instance's: **only with [`Admin::fleet`]** |
//! | `POST /fleet/{action}?breaker={name}` | the action on every instance's breaker of that name: **only with [`Admin::fleet`] and [`Admin::control`]** |
//!
//! Every route, and every unknown path, first checks the request's host
//! name: see [Who may reach it](#who-may-reach-it).
//! Nested under `/admin`, the page is `/admin` itself: axum's nesting
//! routes no `/admin/` (tower-http's `NormalizePath` can add it).
//!
//! Names go in paths percent-encoded (`/breakers/openai%2Fgpt-x`); a name
//! that is a dot segment (`.`, `..`), which browsers and many HTTP clients
//! remove from a path however it is encoded, goes in the query of
//! `/control/{action}` (the page's buttons use that route). The
//! actions are `force-open` (held open until restored; `?for=30s` opens it
//! for that long instead, then it probes as usual), `force-closed`,
//! `disable`, `restore` and `reset`, as [`Breaker`](crate::Breaker) names
//! them. Without [`Admin::control`] the control routes do not exist: they
//! answer `404` like any unknown path.
//!
//! ```
//! use axum::Router;
//! use tower_circuit_breaker::{admin, registry::Registry, Config};
//!
//! let registry = Registry::<String>::new(Config::default());
//! let app: Router = Router::new().nest("/admin", admin::router(registry.clone()));
//! # let _ = app;
//! ```
//!
//! # Breakers as JSON
//!
//! Each breaker is its [`Snapshot`](crate::Snapshot) as the `serde`
//! feature writes it (`name`, `state`, `time_in_state_ms`,
//! `retry_after_ms`, `policy` with its figures, `counts`, `last_trip`...),
//! with two more fields: `parent`, the name [`Admin::parent`] gives (or a
//! registry's own parent function, without it; null for none), and `failure_rate`, failures over the outcomes that counted
//! since the breaker was made (calls, and outcomes recorded from outside
//! calls, less those ignored, stale or cancelled; null before any).
//!
//! `GET /breakers` answers one page:
//!
//! ```json
//! { "total": 10000, "matched": 3, "offset": 0, "limit": 100, "control": false, "fleet": false,
//!   "states": { "closed": 9990, "open": 3, "half_open": 0, ... },
//!   "breakers": [ { "name": "openai/gpt-x", "state": "open", ... } ] }
//! ```
//!
//! Its query parameters, each optional: `prefix` (names starting with it),
//! `state` (one state or several, comma-separated: `open,half_open`),
//! `sort` (`state`, the default: open, half-open and held breakers first,
//! then by name; or `name`), `offset` and `limit` (1 to 1,000; default
//! 100). `states` counts the breakers matching `prefix` in each state, and
//! `matched` those matching both filters. A registry of 10,000 breakers
//! costs a page one state read per breaker, and a snapshot only of the
//! breakers on the page. A parameter the endpoint does not know, or a value
//! it cannot read, is a `400` whose JSON `error` says which.
//!
//! # Escaping
//!
//! A registry's keys often come from request data, so names are treated as
//! hostile: the page never puts one into markup, only into text nodes, so a
//! breaker named `<img src=x onerror=alert(1)>` shows as those characters.
//! The JSON and the events escape `<`, `>` and `&` as `\u003c`, `\u003e` and
//! `\u0026`, so that no document embedding them can mistake a name for
//! markup. The page's own script and style carry a fresh nonce, and its
//! `Content-Security-Policy` allows no other script: an inline handler that
//! got through would not run either. The page and the JSON say `nosniff`
//! and `no-store`; the event stream, `no-cache`.
//!
//! # Events
//!
//! `GET /events` streams each transition as it is made, as an event named
//! `transition` whose data is the [`Transition`](crate::events::Transition)
//! as JSON (the `serde` feature's form). Nothing polls: the stream wakes when
//! a transition is announced. A registry's stream is the registry's own
//! channel ([`Registry::subscribe`](crate::registry::Registry::subscribe));
//! the stream of a set of breakers hears every breaker of the process
//! through one [observer](crate::events::observe) and keeps those of the
//! set's own breakers (by breaker, not by name: another breaker that shares
//! a name with one of them is left out).
//!
//! Each client reads from a bounded buffer of its own (a position in a
//! broadcast channel of 64 transitions for a registry, 1,024 for a set of
//! breakers) that the breakers write to without ever waiting. A client that
//! falls further behind than that, because it reads slowly or a burst
//! outran it, gets a last event, `lagged` (with the number it missed), and
//! its stream ends: the breakers never slow down for it, and it holds no
//! more memory. A browser's `EventSource` reconnects by itself after a
//! second (the stream's first event sets `retry`), and the page reloads
//! what it shows when it does. A comment every 15 seconds of silence
//! ([`Admin::keep_alive`]) keeps proxies from closing the stream and lets
//! the server notice clients that are gone.
//!
//! # Who may reach it
//!
//! The endpoint answers only requests whose `Host` (or, in HTTP/2, whose
//! authority) is one of its names: by default the loopback ones
//! (`localhost`, `127.0.0.0/8`, `[::1]`, any port; subdomains of
//! `localhost` only when named, since a client may ask a resolver for
//! them).
//! Any other is refused with `421 Misdirected Request` on every route.
//! This is what stops DNS rebinding: a page on `attacker.example`, once
//! its owner points that name at this machine's address, is same-origin
//! with whatever the browser finds there, so no `Origin` or
//! `Sec-Fetch-Site` check can tell it from the real page; but the browser
//! still names `attacker.example` as the host. Loopback names are always
//! allowed, since a browser sends them only for a page it loaded from
//! this machine.
//!
//! Served on another interface, name what on-call people type in the
//! address bar with [`Admin::allowed_hosts`]; behind a proxy that checks
//! (or rewrites) the name itself, [`Admin::allow_any_host`] turns the
//! check off. A request naming no host at all (HTTP/1.0) passes: no
//! browser sends one.
//!
//! # Control, and who may use it
//!
//! Control routes change what every request sees, so they exist only when
//! [`Admin::control`] enables them, and should sit behind authentication.
//! tower-http's layers do it for the whole admin router (the browser asks
//! for the password once, then sends it with every request of the page):
//!
//! ```
//! use axum::Router;
//! use tower_circuit_breaker::{admin::Admin, registry::Registry, Config};
//! use tower_http::validate_request::ValidateRequestHeaderLayer;
//!
//! let registry = Registry::<String>::new(Config::default());
//! let admin = Admin::new(registry.clone())
//!     .parent(|name| name.split_once('/').map(|(provider, _)| provider.to_string()))
//!     .control(true)
//!     .router()
//!     .layer(ValidateRequestHeaderLayer::basic("oncall", "correct horse battery staple"));
//! let app: Router = Router::new().nest("/admin", admin);
//! # let _ = app;
//! ```
//!
//! Control requests that a browser marks as coming from another site
//! (`Sec-Fetch-Site`, or an `Origin` other than the `Host`) are refused
//! with `403`, and requests under a host the endpoint is not served under
//! with `421` ([above](#who-may-reach-it)), so that a page elsewhere cannot
//! make an on-call person's browser press the buttons. Requests without
//! the cross-site marks (`curl`, a script) pass that check, but not the
//! host check: they too must name a host the endpoint is served under.
//! Answers give what changed:
//!
//! ```json
//! { "action": "force-open", "changed": true, "breaker": { "name": "openai", "state": "forced_open", ... } }
//! { "action": "reset", "prefix": "openai/", "matched": 4, "changed": 1 }
//! ```

//!
//! # The fleet
//!
//! Given the fleet store its breakers share state through
//! ([`Admin::fleet`]), the endpoint shows and steers a name across the
//! whole fleet, not only on the instance that serves the page.
//! `GET /fleet?breaker=openai` reads what the fleet keeps of the name
//! (from Redis, for a [`RedisStore`](crate::store::redis::RedisStore)) and
//! shows it beside this instance's breaker:
//!
//! ```json
//! { "breaker": "openai", "instance": "gw-1-5f2c9a0e71b3d4c8", "shared": true,
//!   "fleet": { "state": "open",
//!              "opening": { "generation": 41, "attempt": 2, "open_for_ms": 17250,
//!                           "kept_for_ms": 377250, "min_open_for_ms": 0, "probe_successes": 0 },
//!              "failures": 0, "failing": [], "votes": ["gw-3"],
//!              "prober": null, "control": null },
//!   "local": { "name": "openai", "state": "open", ... } }
//! ```
//!
//! `instance` is this instance's name in the fleet (the store's
//! [`instance`](crate::store::redis::RedisStore::instance): the name it
//! was given, with a suffix unique to the process), as `prober.instance`
//! names the instance holding the probe lock; `failing` and `votes` name
//! the instances counted toward a quorum (its voters). `shared` says
//! whether this instance shares the name now (false while Redis, or the
//! Cluster node holding the name, does not answer); `local` is null when
//! this instance has no breaker of that name. A fleet that cannot be read
//! answers `503` with the error.
//!
//! With [`Admin::control`] as well, `POST /fleet/{action}?breaker=openai`
//! (the same actions, `force-open` with its `?for=`) acts on every
//! instance's breaker of that name, as [`Fleet`]
//! describes: this instance's at once, the others' within milliseconds by
//! the store's push, or at the latest within one refresh interval, and an
//! instance that makes its breaker of that name later, on making it.
//! `restore` undoes it everywhere the same way. The answer is the view
//! above after the action, with `"action"`; a fleet that cannot be reached
//! answers `503`, having changed nothing. Fleet control acts on one name
//! at a time (no prefix), under the same checks as every control route
//! ([below](#control-and-who-may-use-it)). The page shows a *fleet-wide*
//! switch beside its buttons, and a *fleet* button per breaker that shows
//! the fleet's view.

mod control;
mod fleet;
mod host;
mod json;
mod list;
mod page;
mod source;
mod stream;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;

use crate::store::Fleet;
use host::Hosts;
pub use source::Source;

/// How long an event stream may stay silent before it sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The shortest keep-alive interval: a comment at most once a second, so
/// that no setting makes a stream send as fast as its client reads.
const MIN_KEEP_ALIVE: Duration = Duration::from_secs(1);

type ParentOf = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The admin endpoint over `breakers` (a [`Registry`](crate::registry::Registry),
/// a [`Breaker`](crate::Breaker), a `Vec` of them or a
/// [`BreakerGroup`](crate::BreakerGroup)), read-only: the page, the JSON and
/// the events, without control. [`Admin`] sets more.
///
/// ```
/// use axum::Router;
/// use tower_circuit_breaker::{admin, Breaker, Config};
///
/// let breakers = vec![
///     Breaker::new(Config::builder().name("openai").build()?),
///     Breaker::new(Config::builder().name("anthropic").build()?),
/// ];
/// let app: Router = Router::new().nest("/admin", admin::router(breakers));
/// # let _ = app;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
pub fn router(breakers: impl Into<Source>) -> Router {
    Admin::new(breakers).router()
}

/// Builds the admin endpoint: which breakers, whether control is on, how
/// to name a breaker's parent. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use axum::Router;
/// use tower_circuit_breaker::{admin::Admin, registry::Registry, Config};
///
/// let registry = Registry::<String>::new(Config::default());
/// let app: Router = Router::new().nest(
///     "/admin",
///     Admin::new(registry.clone())
///         .parent(|name| name.split_once('/').map(|(provider, _)| provider.to_string()))
///         .keep_alive(Some(Duration::from_secs(30)))
///         .router(), // no control: the POST routes answer 404
/// );
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct Admin {
    source: Source,
    control: bool,
    parent_of: Option<ParentOf>,
    keep_alive: Option<Duration>,
    hosts: Hosts,
    fleet: Option<Fleet>,
}

impl Admin {
    /// The admin endpoint over `breakers`: read-only, no parents, a
    /// keep-alive every 15 seconds.
    pub fn new(breakers: impl Into<Source>) -> Self {
        Admin {
            source: breakers.into(),
            control: false,
            parent_of: None,
            keep_alive: Some(KEEP_ALIVE),
            hosts: Hosts::Loopback,
            fleet: None,
        }
    }

    /// Whether the control routes exist (default: no). With them, the page
    /// shows buttons; put the router behind authentication (see the
    /// [module docs](self#control-and-who-may-use-it)).
    pub fn control(mut self, enabled: bool) -> Self {
        self.control = enabled;
        self
    }

    /// The fleet store the breakers share their state through (a
    /// [`RedisStore`](crate::store::redis::RedisStore) or a
    /// [`MemoryStore`](crate::store::memory::MemoryStore)): `GET
    /// /fleet?breaker={name}` shows the fleet's view of a name beside this
    /// instance's, and with [`control`](Self::control), `POST
    /// /fleet/{action}?breaker={name}` acts on every instance's breaker of
    /// that name. See [the module docs](self#the-fleet).
    ///
    /// ```
    /// use tower_circuit_breaker::{admin::Admin, registry::Registry, store::memory::MemoryFleet, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryFleet::builder().build()?.instance();
    /// let registry: Registry<String> =
    ///     Registry::builder().default_config(Config::default()).store(&store).build();
    /// let admin = Admin::new(registry).fleet(&store).control(true).router::<()>();
    /// # let _ = admin;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fleet(mut self, fleet: impl Into<Fleet>) -> Self {
        self.fleet = Some(fleet.into());
        self
    }

    /// How to name a breaker's parent from its name, shown as `parent` in
    /// the JSON and under the name on the page. Over a
    /// [`Registry`](crate::registry::Registry) with a
    /// [parent function](crate::registry::RegistryBuilder::parent), the
    /// registry's is used without this; this one replaces it.
    pub fn parent(
        mut self,
        parent_of: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.parent_of = Some(Arc::new(parent_of));
        self
    }

    /// How long an event stream may stay silent before it sends a comment
    /// (default 15 s); `None` sends none. An interval under a second is
    /// taken as one second.
    pub fn keep_alive(mut self, every: Option<Duration>) -> Self {
        self.keep_alive = every.map(|every| every.max(MIN_KEEP_ALIVE));
        self
    }

    /// The host names the endpoint answers under, beside the loopback ones
    /// (default: loopback only). Each is a name, an IPv4 address or a
    /// bracketed IPv6 one, as a `Host` header writes it; ports are not
    /// compared. Every route answers a request naming any other host with
    /// `421 Misdirected Request`. See
    /// [the module docs](self#who-may-reach-it).
    ///
    /// ```
    /// use tower_circuit_breaker::{admin::Admin, Breaker, Config};
    ///
    /// let breaker = Breaker::new(Config::default());
    /// // Served on every interface, reached as http://ops-gateway-1:9000/.
    /// let admin = Admin::new(breaker).allowed_hosts(["ops-gateway-1", "10.0.4.17"]);
    /// # let _ = admin;
    /// ```
    pub fn allowed_hosts<I, H>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: AsRef<str>,
    {
        self.hosts = Hosts::also(hosts);
        self
    }

    /// Answers under any host name: for an endpoint behind a proxy that
    /// checks the name itself (or rewrites it). Without such a proxy, a
    /// page on any name that its owner points at this machine can read the
    /// breakers and, with [`control`](Self::control), press the buttons.
    pub fn allow_any_host(mut self) -> Self {
        self.hosts = Hosts::Any;
        self
    }

    /// The router, to nest under any path (or serve as it is). Its state is
    /// its own, so it nests into a router of any state.
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let control = self.control;
        let mut router = Router::new()
            .route("/", get(page::page))
            .route("/breakers", get(list::list))
            .route("/breakers/{name}", get(list::one))
            .route("/events", get(stream::events));
        if control {
            router = router
                .route("/breakers/{name}/{action}", post(control::one))
                .route("/groups/{prefix}/{action}", post(control::group))
                .route("/control/{action}", post(control::by_query));
        }
        if self.fleet.is_some() {
            router = router.route("/fleet", get(fleet::view));
            if control {
                router = router.route("/fleet/{action}", post(fleet::control));
            }
        }
        let admin = Arc::new(self);
        // `layer`, not `route_layer`, over a fallback of its own (nesting
        // drops a router's default one): unknown paths are checked too, so
        // a page on another name learns nothing of which routes exist.
        router
            .fallback(unknown_path)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&admin),
                host::check,
            ))
            .with_state(admin)
    }

    /// The names of the parents of `of`: by [`parent`](Self::parent)'s
    /// function if it was given, else by the registry's.
    fn parents(&self, of: &[&crate::Breaker]) -> Vec<Option<String>> {
        match &self.parent_of {
            Some(parent_of) => of.iter().map(|b| parent_of(b.name())).collect(),
            None => self.source.parents(of),
        }
    }
}

/// Any path the endpoint does not serve (control routes included, while
/// control is off).
async fn unknown_path() -> axum::response::Response {
    json::error(
        http::StatusCode::NOT_FOUND,
        "the admin endpoint has no such route".to_string(),
    )
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("source", &self.source)
            .field("control", &self.control)
            .field("parent", &self.parent_of.is_some())
            .field("keep_alive", &self.keep_alive)
            .field("hosts", &self.hosts)
            .field("fleet", &self.fleet)
            .finish()
    }
}
