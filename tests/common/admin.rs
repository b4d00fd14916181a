//! A client of the admin endpoint over real sockets on 127.0.0.1: hyper's
//! HTTP/1 client, one connection per stream, and a reader of server-sent
//! events as a browser's `EventSource` reads them.
//!
//! Used by the admin tests; each uses a part, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::net::SocketAddr;

use axum::Router;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};

/// Serves `router` on a free port of 127.0.0.1 until the test's runtime
/// ends; returns its address.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A connection of its own to `addr`; with `receive_buffer`, the socket's
/// receive buffer is that small (a client that reads slowly fills it soon).
pub async fn connect(addr: SocketAddr, receive_buffer: Option<u32>) -> SendRequest<Empty<Bytes>> {
    let socket = TcpSocket::new_v4().expect("a socket");
    if let Some(size) = receive_buffer {
        socket
            .set_recv_buffer_size(size)
            .expect("a receive buffer size");
    }
    let stream = socket.connect(addr).await.expect("a connection");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("an HTTP/1 handshake");
    tokio::spawn(connection);
    sender
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("a text header"))
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
    }
}

/// Sends `method path` with `headers` on a fresh connection (`Host` is
/// `addr`, unless `headers` name one).
pub async fn send(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut sender = connect(addr, None).await;
    let mut request = Request::builder().method(method).uri(path);
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request = request.header("host", addr.to_string());
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::new()).expect("a request"))
        .await
        .expect("an answer");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).expect("a UTF-8 body"),
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path, &[]).await
}

pub async fn post(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::POST, path, &[]).await
}

/// Every byte but ASCII letters and digits percent-encoded, as
/// `encodeURIComponent` does (and more).
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// One server-sent event: its name, data, comments and reconnection delay.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sse {
    pub event: Option<String>,
    pub data: String,
    pub comments: Vec<String>,
    pub retry: Option<u64>,
}

impl Sse {
    /// The data as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.data))
    }
}

/// A stream of events, read as they arrive.
pub struct Events {
    body: Incoming,
    buffer: String,
    pub headers: HeaderMap,
}

impl Events {
    /// Opens `path` (an event stream) on a connection of its own.
    pub async fn open(addr: SocketAddr, path: &str) -> Events {
        Events::open_with(addr, path, None).await
    }

    /// [`open`](Self::open), with a socket receive buffer of that size.
    pub async fn open_with(addr: SocketAddr, path: &str, receive_buffer: Option<u32>) -> Events {
        let mut sender = connect(addr, receive_buffer).await;
        let request = Request::get(path)
            .header("host", addr.to_string())
            .header("accept", "text/event-stream")
            .body(Empty::new())
            .expect("a request");
        let response = sender.send_request(request).await.expect("an answer");
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "text/event-stream");
        Events {
            body: response.into_body(),
            buffer: String::new(),
            headers,
        }
    }

    /// The next event (a comment alone counts as one), or `None` once the
    /// stream has ended.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                return Some(parse(&block));
            }
            match self.body.frame().await {
                None => return None,
                Some(Err(err)) => panic!("the stream broke: {err}"),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer
                            .push_str(std::str::from_utf8(&data).expect("UTF-8 events"));
                    }
                }
            }
        }
    }

    /// The next event that is not only a comment.
    pub async fn next_event(&mut self) -> Option<Sse> {
        loop {
            let sse = self.next().await?;
            if sse.event.is_some() || !sse.data.is_empty() {
                return Some(sse);
            }
        }
    }
}

fn parse(block: &str) -> Sse {
    let mut sse = Sse::default();
    let mut data = Vec::new();
    for line in block.lines().filter(|l| !l.is_empty()) {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "" => sse.comments.push(value.to_string()),
            "event" => sse.event = Some(value.to_string()),
            "data" => data.push(value),
            "retry" => sse.retry = value.parse().ok(),
            other => panic!("an unknown field {other:?} in {block:?}"),
        }
    }
    sse.data = data.join("\n");
    sse
}
