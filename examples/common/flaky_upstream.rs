//! A local HTTP upstream that answers `200 OK` or, while failing, `503`,
//! and counts the requests it receives: what the examples of the breaker
//! outside tower (`background_job`, `websocket`) call, and their tests
//! (`tests/loopback/outside_tower_examples.rs`) too. Included by path.
#![allow(dead_code)] // each user needs only part of it

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// The upstream: its address, whether it fails, and what it received.
#[derive(Clone)]
pub struct FlakyUpstream {
    addr: SocketAddr,
    failing: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
}

impl FlakyUpstream {
    /// Serves on a free port of 127.0.0.1 until the runtime shuts down.
    pub async fn start() -> io::Result<FlakyUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = FlakyUpstream {
            addr: listener.local_addr()?,
            failing: Arc::default(),
            received: Arc::default(),
        };
        let server = upstream.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    server.received.fetch_add(1, Ordering::SeqCst);
                    let status = if server.failing.load(Ordering::SeqCst) {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    };
                    let mut response = Response::new(Full::new(Bytes::from_static(b"done")));
                    *response.status_mut() = status;
                    async move { Ok::<_, hyper::Error>(response) }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(upstream)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts or stops failing.
    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Requests received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }

    /// A request for `path` on it.
    pub fn request(&self, path: &str) -> Request<Empty<Bytes>> {
        Request::get(format!("http://{}{path}", self.addr))
            .body(Empty::new())
            .expect("a valid request")
    }
}

/// The HTTP client the examples call the upstream with.
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A hyper-util client, as an application would keep one.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}
