//! tonic servers on free ports of 127.0.0.1, serving until the runtime
//! shuts down.
//!
//! Used by the tests that call gRPC servers; each uses a part,
//! hence the `dead_code` allowance.
#![allow(dead_code)]

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::transport::Server;

/// Serves `router` on a free port of 127.0.0.1; returns the address.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

/// A `tonic-health` server, serving: `Check` of the server as a whole
/// answers `SERVING`, of a service it does not know `NOT_FOUND`.
pub async fn health_server() -> SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    serve(Server::builder().add_service(health)).await
}
