//! The gateway: the whole wiring of the model router, built from the
//! crate's public layers. The README's gateway section is this file.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::failover::{Exhausted, Failover};
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::Config;

/// How long a provider may take to answer a call's head: the client's
/// timeout, inside the breaker so that a hang is a failure it sees.
pub const TIMEOUT: Duration = Duration::from_millis(500);
/// How long a stream may take to its first token, and stay silent
/// between two: past either it ends with an error and counts as a failure.
pub const FIRST_TOKEN: Duration = Duration::from_millis(400);
pub const BETWEEN_TOKENS: Duration = Duration::from_millis(250);

/// The largest request body the gateway reads.
const MAX_REQUEST: usize = 64 * 1024;

/// A chat completion request: the model it asks for, and its JSON body.
/// The model comes from the client: each new one makes a breaker, within
/// the registry's bound (`max_keys`), past which the gateway answers 503
/// rather than grow.
#[derive(Clone, Debug)]
pub struct Chat {
    pub model: String,
    pub body: Bytes,
}

impl Chat {
    /// Reads a request body `{"model": "...", ...}`; `None` without a model.
    pub fn parse(body: Bytes) -> Option<Chat> {
        let text = std::str::from_utf8(&body).ok()?;
        let (_, rest) = text.split_once("\"model\"")?;
        let (_, rest) = rest.split_once('"')?;
        let (model, _) = rest.split_once('"')?;
        Some(Chat {
            model: model.to_string(),
            body,
        })
    }

    /// The request to the provider at `addr`.
    fn to(self, addr: SocketAddr) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = format!("http://{addr}/v1/chat/completions")
            .parse()
            .expect("a loopback address makes a valid URI");
        request
    }
}

/// One breaker per `provider/model`, each under its provider's.
pub fn registry(cooldown: Duration) -> Registry<String> {
    let config = Config::model_router()
        .cooldown(cooldown)
        .min_open(cooldown)
        .first_frame_timeout(Some(FIRST_TOKEN))
        .frame_idle_timeout(Some(BETWEEN_TOKENS))
        .build()
        .expect("a valid config");
    Registry::builder()
        .default_config(config)
        .parent(|key: &String| {
            key.split_once('/')
                .map(|(provider, _)| provider.to_string())
        })
        .build()
}

/// The router: each request tries the providers in order, each behind the
/// breaker of (provider, request's model) and the provider's, judged at
/// the end of the streamed answer. An open breaker, the model's or the
/// provider's, skips the provider without calling it.
pub fn router(
    registry: &Registry<String>,
    providers: &[(&'static str, SocketAddr)],
) -> impl Service<
    Chat,
    Response = Response<impl http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static>,
    Error = BoxError,
    Future = impl Send,
> + Clone
       + Send
       + Sync
       + 'static {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let candidates = providers.iter().map(|&(provider, addr)| {
        ServiceBuilder::new()
            .layer(
                KeyedLayer::new(registry.clone(), move |chat: &Chat| {
                    format!("{provider}/{}", chat.model)
                })
                // Statuses, the providers' hints, and error events inside a 200.
                .classify(StreamingHttp::new().sse_errors()),
            )
            .timeout(TIMEOUT)
            .map_request(move |chat: Chat| chat.to(addr))
            .service(client.clone())
    });
    Failover::new(candidates.collect::<Vec<_>>()).classify(StreamingHttp::new())
}

type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Serves the router on `listener`: the provider's events are streamed to
/// the client as they come; when every provider is out, a 503 with the
/// soonest `Retry-After`.
pub async fn serve<R, B>(listener: TcpListener, router: R)
where
    R: Service<Chat, Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    R::Future: Send,
    B: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
{
    while let Ok((stream, _)) = listener.accept().await {
        let router = router.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            // A clone per request, as servers call services.
            answer(router.clone(), req)
        });
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new();
            let _ = connection
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer<R, B>(router: R, req: Request<Incoming>) -> Result<Response<Body>, Infallible>
where
    R: Service<Chat, Response = Response<B>, Error = BoxError>,
    B: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
{
    // A chat request is small: a bigger body is refused, not buffered.
    let body = http_body_util::Limited::new(req.into_body(), MAX_REQUEST);
    let chat = match body.collect().await {
        Ok(body) => Chat::parse(body.to_bytes()),
        Err(_) => None,
    };
    let Some(chat) = chat else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    Ok(match router.oneshot(chat).await {
        Ok(stream) => stream.map(BodyExt::boxed_unsync),
        Err(err) => match Exhausted::take(err) {
            Ok(every_provider_out) => every_provider_out.to_http_response(),
            Err(_) => status(StatusCode::BAD_GATEWAY),
        },
    })
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Body::default());
    *response.status_mut() = code;
    response
}
