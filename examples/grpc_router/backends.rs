//! The gRPC router example's backends: `tonic-health` servers on loopback,
//! each failing in one way a real backend does, each counting the RPCs it
//! receives.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Code, Status};
use tower::{Layer, Service};

/// How a backend fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It answers every RPC.
    None,
    /// It accepts every RPC and never answers: only a deadline ends it.
    Hang,
    /// It answers every RPC RESOURCE_EXHAUSTED with
    /// `grpc-retry-pushback-ms`.
    PushBack(Duration),
    /// It answers unary RPCs; each `Watch` stream sends its first message
    /// and then ends with UNAVAILABLE in its trailers, as a draining server
    /// ends its streams.
    DrainStreams,
}

/// A running backend.
#[derive(Clone, Debug)]
pub struct Backend {
    /// Its name, which its breakers' keys start with.
    pub name: &'static str,
    /// Its URL.
    pub url: String,
    received: Arc<AtomicUsize>,
}

impl Backend {
    /// Serves `grpc.health.v1.Health` (reporting SERVING) on a free port of
    /// 127.0.0.1 until the runtime shuts down, failing as `fault` says.
    pub async fn start(name: &'static str, fault: Fault) -> io::Result<Backend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (_reporter, health) = tonic_health::server::health_reporter();
        let received = Arc::new(AtomicUsize::new(0));
        let faulty = FaultLayer {
            fault,
            received: received.clone(),
        };
        tokio::spawn(
            Server::builder()
                .layer(faulty)
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        Ok(Backend {
            name,
            url,
            received,
        })
    }

    /// RPCs received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

/// The server-side layer that counts RPCs and fails them.
#[derive(Clone)]
struct FaultLayer {
    fault: Fault,
    received: Arc<AtomicUsize>,
}

impl<S> Layer<S> for FaultLayer {
    type Service = Faulty<S>;

    fn layer(&self, inner: S) -> Faulty<S> {
        Faulty {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Faulty<S> {
    inner: S,
    layer: FaultLayer,
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<S> Service<Request<Body>> for Faulty<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.layer.received.fetch_add(1, Ordering::SeqCst);
        let stream = request.uri().path().ends_with("/Watch");
        match self.layer.fault {
            Fault::Hang => Box::pin(std::future::pending()),
            Fault::PushBack(wait) => {
                let mut metadata = MetadataMap::new();
                let ms = wait.as_millis().to_string();
                metadata.insert("grpc-retry-pushback-ms", ms.parse().expect("digits"));
                let status = Status::with_metadata(Code::ResourceExhausted, "slow down", metadata);
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
            Fault::DrainStreams if stream => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await?;
                    Ok(response.map(|body| {
                        Body::new(Draining {
                            inner: body,
                            sent: false,
                            ended: false,
                        })
                    }))
                })
            }
            Fault::None | Fault::DrainStreams => Box::pin(self.inner.call(request)),
        }
    }
}

/// A stream body that ends with UNAVAILABLE after its first message.
struct Draining {
    inner: Body,
    /// Whether the first message went out; then only the trailers are left.
    sent: bool,
    ended: bool,
}

impl http_body::Body for Draining {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.sent {
            self.ended = true;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from(Code::Unavailable as i32));
            trailers.insert("grpc-message", HeaderValue::from_static("draining"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &frame {
            self.sent = frame.is_data();
        }
        frame
    }
}
