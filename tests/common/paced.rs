//! A provider's streamed body on tokio's clock: each chunk after its delay,
//! sent by a task, so that paused time paces it.
//!
//! Each binary uses a part, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tower::BoxError;

/// A provider's stream: each chunk after its delay; then it ends, or, when
/// made to hold, stays open sending nothing (the sender is kept alive).
pub struct Paced(mpsc::Receiver<&'static [u8]>);

/// Each of `chunks` after its delay; then the end, or, when `then_hold`,
/// silence until the body is dropped.
pub fn paced(chunks: Vec<(Duration, &'static [u8])>, then_hold: bool) -> Paced {
    let (send, receive) = mpsc::channel(1);
    tokio::spawn(async move {
        for (delay, chunk) in chunks {
            tokio::time::sleep(delay).await;
            if send.send(chunk).await.is_err() {
                return;
            }
        }
        if then_hold {
            send.closed().await;
        }
    });
    Paced(receive)
}

impl Body for Paced {
    type Data = &'static [u8];
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}
