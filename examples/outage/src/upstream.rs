//! The providers over real HTTP: a hyper 1 server per provider on a random
//! free port of 127.0.0.1, and a hyper-util client to reach it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError};

use crate::scenario::{Provider, Upstream};

/// Serves `provider` on a free port of 127.0.0.1; returns the address. The
/// server runs until the process ends. Call it inside the tokio runtime.
pub fn serve(provider: Arc<Provider>) -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let provider = provider.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let provider = provider.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let prompt = body.collect().await?.to_bytes();
                        let prompt = String::from_utf8_lossy(&prompt).into_owned();
                        let reply = provider.answer(Request::from_parts(parts, prompt)).await;
                        Ok::<_, hyper::Error>(reply.map(|text| Full::new(Bytes::from(text))))
                    }
                });
                // A client that gave up closes its connection: not an error
                // worth reporting in a demo about exactly that.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// One pooled HTTP client for every provider.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A tower service that sends a prompt to the provider at `addr`.
pub fn connect(client: &Client<HttpConnector, Full<Bytes>>, addr: SocketAddr) -> Upstream {
    let client = client.clone();
    BoxCloneService::new(service_fn(move |prompt: Request<String>| {
        let client = client.clone();
        async move {
            let (mut parts, body) = prompt.into_parts();
            parts.method = http::Method::POST;
            parts.uri = format!("http://{addr}/v1/complete").parse()?;
            let request = Request::from_parts(parts, Full::new(Bytes::from(body)));
            let (parts, body) = client.request(request).await?.into_parts();
            let body = body.collect().await?.to_bytes();
            let text = String::from_utf8_lossy(&body).into_owned();
            Ok::<_, BoxError>(Response::from_parts(parts, text))
        }
    }))
}
