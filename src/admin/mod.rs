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
//!
//! Nested under `/admin`, the page is `/admin` itself: axum's nesting
//! routes no `/admin/` (tower-http's `NormalizePath` can add it).
//!
//! Names go in paths percent-encoded (`/breakers/openai%2Fgpt-x`). The
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
//! with two more fields: `parent`, the name [`Admin::parent`] gives (or
//! null), and `failure_rate`, failures over the calls whose outcome counted
//! since the breaker was made (null before any).
//!
//! `GET /breakers` answers one page:
//!
//! ```json
//! { "total": 10000, "matched": 3, "offset": 0, "limit": 100, "control": false,
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
//! through one [observer](crate::events::observe) and keeps those named in
//! the set.
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
//! with `403`, so that a page elsewhere cannot make an on-call person's
//! browser press the buttons; requests without those headers (`curl`, a
//! script) are not affected. Answers give what changed:
//!
//! ```json
//! { "action": "force-open", "changed": true, "breaker": { "name": "openai", "state": "forced_open", ... } }
//! { "action": "reset", "prefix": "openai/", "matched": 4, "changed": 1 }
//! ```

mod control;
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

pub use source::Source;

/// How long an event stream may stay silent before it sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

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
        }
    }

    /// Whether the control routes exist (default: no). With them, the page
    /// shows buttons; put the router behind authentication (see the
    /// [module docs](self#control-and-who-may-use-it)).
    pub fn control(mut self, enabled: bool) -> Self {
        self.control = enabled;
        self
    }

    /// How to name a breaker's parent from its name (a registry's parent
    /// function, on names), shown as `parent` in the JSON and under the
    /// name on the page.
    pub fn parent(
        mut self,
        parent_of: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.parent_of = Some(Arc::new(parent_of));
        self
    }

    /// How long an event stream may stay silent before it sends a comment
    /// (default 15 s); `None` sends none.
    pub fn keep_alive(mut self, every: Option<Duration>) -> Self {
        self.keep_alive = every;
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
                .route("/groups/{prefix}/{action}", post(control::group));
        }
        router.with_state(Arc::new(self))
    }

    /// The parent `name` is given, if any.
    fn parent_of(&self, name: &str) -> Option<String> {
        self.parent_of
            .as_ref()
            .and_then(|parent_of| parent_of(name))
    }
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("source", &self.source)
            .field("control", &self.control)
            .field("parent", &self.parent_of.is_some())
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}
