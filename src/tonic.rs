//! tonic integration (feature `tonic`): a refused call becomes a gRPC
//! `UNAVAILABLE` status with a pushback, so that a breaker can guard a
//! tonic `Channel` or a generated client's method with `tonic::Status` as
//! its error type. The classifier of `Status` errors is
//! [`classify::TonicClassifier`](crate::classify::TonicClassifier); the
//! wiring of a `Channel`, the crate's guide (section *Wiring each client*).

use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::classify::tonic::PUSHBACK;
use crate::error::CircuitOpen;
use crate::millis::millis_up;

impl From<CircuitOpen> for Status {
    /// `UNAVAILABLE`, with the retry delay in milliseconds as
    /// `grpc-retry-pushback-ms` metadata, and the `CircuitOpen` as the
    /// status's source (so [`CircuitOpen::find`] finds it).
    ///
    /// A delay under a second (down to zero: the time the refusal named has
    /// passed, or the probes in flight reach their deadline that instant)
    /// is sent as 1000 ms, the same one-second floor as the HTTP
    /// `Retry-After` ([`CircuitOpen::to_http_response`]): a pushback of a
    /// few milliseconds tells a gRPC client to retry at once, into the same
    /// refusal.
    ///
    /// The message names the breaker, and a server that returns this
    /// status sends the name to its client: name breakers after what a
    /// client may know (a provider, a model), or map the error to a status
    /// of your own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic::{Code, Status};
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_circuit_breaker::{Breaker, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let breaker = Breaker::new(Config::builder().name("search").build()?);
    /// breaker.force_open(Some(Duration::from_millis(2_500)));
    /// let rpc = breaker.layer().layer(service_fn(|_: ()| async { Ok::<_, Status>(()) }));
    ///
    /// let status = rpc.oneshot(()).await.unwrap_err(); // From<CircuitOpen> made it
    /// assert_eq!(status.code(), Code::Unavailable);
    /// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "2500");
    /// # Ok(())
    /// # }
    /// ```
    fn from(open: CircuitOpen) -> Status {
        // Rounded up: a client told to come back never comes back early;
        // and never under a second, as `Retry-After` in whole seconds.
        let delay_ms = millis_up(open.retry_after()).max(1000);
        let mut status = Status::unavailable(format!(
            "upstream `{}` is unavailable; retry after {delay_ms} ms",
            open.breaker()
        ));
        status
            .metadata_mut()
            .insert(PUSHBACK, MetadataValue::from(delay_ms));
        status.set_source(Arc::new(open));
        status
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::metadata::MetadataValue;
    use tonic::Code;

    use super::*;
    use crate::classify::Outcome;
    use crate::classify::{Classify, TonicClassifier, Verdict};
    use crate::error::Name;
    use crate::State;

    fn refusal(retry_after_ms: u64) -> CircuitOpen {
        CircuitOpen::new(
            Name::new(&Arc::from("search")),
            tokio::time::Instant::now() + Duration::from_millis(retry_after_ms),
            State::Open,
        )
    }

    fn classify(classifier: TonicClassifier, status: &Status) -> Verdict {
        Classify::<(), _>::classify(&classifier, Err(status))
    }

    #[test]
    fn a_refusal_is_unavailable_with_its_delay_as_pushback() {
        let status = Status::from(refusal(2_345));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.metadata().get(PUSHBACK).unwrap(), "2345");
        assert_eq!(
            status.message(),
            "upstream `search` is unavailable; retry after 2345 ms"
        );
        let open = CircuitOpen::find(&status).expect("the refusal is the source");
        assert_eq!(open.breaker(), "search");
    }

    #[test]
    fn a_delay_under_a_second_is_sent_as_one_second() {
        for ms in [0, 1, 999, 1000] {
            let status = Status::from(refusal(ms));
            assert_eq!(status.metadata().get(PUSHBACK).unwrap(), "1000", "{ms} ms");
        }
        let status = Status::from(refusal(1001));
        assert_eq!(status.metadata().get(PUSHBACK).unwrap(), "1001");
    }

    #[test]
    fn a_remote_breakers_refusal_is_a_failure_with_its_pushback() {
        // A server behind its own breaker refuses; the client's breaker reads it.
        let verdict = classify(TonicClassifier::new(), &Status::from(refusal(7_000)));
        assert_eq!(verdict.outcome(), Outcome::Failure);
        assert_eq!(verdict.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn codes_map_to_outcomes() {
        let default = TonicClassifier::new();
        let strict = TonicClassifier::new().internal_is_failure(true);
        let ok = Classify::<(), Status>::classify(&default, Ok(&()));
        assert_eq!(ok.outcome(), Outcome::Success);
        for (code, by_default, when_strict) in [
            (Code::Ok, Outcome::Success, Outcome::Success),
            (Code::Unavailable, Outcome::Failure, Outcome::Failure),
            (Code::DeadlineExceeded, Outcome::Failure, Outcome::Failure),
            (Code::ResourceExhausted, Outcome::Failure, Outcome::Failure),
            (Code::Internal, Outcome::Ignore, Outcome::Failure),
            (Code::Unknown, Outcome::Ignore, Outcome::Failure),
            (Code::InvalidArgument, Outcome::Ignore, Outcome::Ignore),
            (Code::NotFound, Outcome::Ignore, Outcome::Ignore),
            (Code::PermissionDenied, Outcome::Ignore, Outcome::Ignore),
            (Code::Unauthenticated, Outcome::Ignore, Outcome::Ignore),
            (Code::FailedPrecondition, Outcome::Ignore, Outcome::Ignore),
            (Code::Cancelled, Outcome::Ignore, Outcome::Ignore),
            (Code::Unimplemented, Outcome::Ignore, Outcome::Ignore),
        ] {
            let status = Status::new(code, "");
            assert_eq!(classify(default, &status).outcome(), by_default, "{code:?}");
            assert_eq!(classify(strict, &status).outcome(), when_strict, "{code:?}");
        }
    }

    #[test]
    fn pushback_is_a_hint_on_failures_only_and_garbage_is_ignored() {
        let with_pushback = |code: Code, value: &'static str| {
            let mut status = Status::new(code, "");
            status
                .metadata_mut()
                .insert(PUSHBACK, MetadataValue::from_static(value));
            status
        };
        let c = TonicClassifier::new();
        assert_eq!(
            classify(c, &with_pushback(Code::Unavailable, "1500")).retry_after(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            classify(c, &with_pushback(Code::InvalidArgument, "1500")).retry_after(),
            None,
            "ignored outcomes carry no hint"
        );
        let ignoring = c.ignore_pushback();
        let verdict = classify(ignoring, &with_pushback(Code::Unavailable, "1500"));
        assert_eq!(
            (verdict.outcome(), verdict.retry_after()),
            (Outcome::Failure, None)
        );
        for garbage in ["-1", "1.5", "soon", ""] {
            let verdict = classify(c, &with_pushback(Code::Unavailable, garbage));
            assert_eq!(verdict.outcome(), Outcome::Failure, "{garbage:?}");
            assert_eq!(verdict.retry_after(), None, "{garbage:?}");
        }
    }
}
