//! tonic integration (feature `tonic`): a refused call becomes a gRPC
//! `UNAVAILABLE` status with a pushback (as do a failover whose every
//! candidate is out and, without a pushback, a full registry), so that a breaker can guard a
//! tonic `Channel` or a generated client's method with `tonic::Status` as
//! its error type. The classifier of `Status` errors is
//! [`classify::TonicClassifier`](crate::classify::TonicClassifier); the
//! wiring of a `Channel`, the crate's guide (section *Wiring each client*).

use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::classify::tonic::PUSHBACK;
use crate::error::CircuitOpen;
use crate::failover::Exhausted;
use crate::millis::millis_up;
use crate::registry::RegistryFull;

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
        let mut status = unavailable(&open);
        status.set_source(Arc::new(open));
        status
    }
}

/// The status of a refusal, without a source: what `CircuitOpen`'s own
/// source is, so that an error chain ends there.
pub(crate) fn unavailable(open: &CircuitOpen) -> Status {
    let delay_ms = pushback_ms(open.retry_after());
    let mut status = Status::unavailable(format!(
        "upstream `{}` is unavailable; retry after {delay_ms} ms",
        open.breaker()
    ));
    status
        .metadata_mut()
        .insert(PUSHBACK, MetadataValue::from(delay_ms));
    status
}

/// A delay as a pushback: rounded up (a client told to come back never
/// comes back early), and never under a second, as `Retry-After` in whole
/// seconds.
fn pushback_ms(delay: std::time::Duration) -> u64 {
    millis_up(delay).max(1000)
}

impl From<Exhausted> for Status {
    /// `UNAVAILABLE`, with the smallest retry-after among the open
    /// candidates as `grpc-retry-pushback-ms` (rounded up, at least 1000),
    /// or no pushback when no open candidate has a known end; the
    /// `Exhausted` as the status's source ([`Exhausted::find`] finds it).
    /// The message names no candidate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic::{Code, Status};
    /// use tower_circuit_breaker::failover::{Exhausted, Reason, Unavailable};
    /// use tower_circuit_breaker::State;
    ///
    /// let exhausted = Exhausted::new([
    ///     Unavailable::new(0, "search-a", Reason::open(State::Open, Some(Duration::from_millis(2_500)))),
    ///     Unavailable::new(1, "search-b", Reason::failed(None, None)),
    /// ]);
    /// let status = Status::from(exhausted);
    /// assert_eq!(status.code(), Code::Unavailable);
    /// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "2500");
    /// ```
    fn from(exhausted: Exhausted) -> Status {
        let pushback = exhausted.retry_after().map(pushback_ms);
        let mut status = Status::unavailable(match pushback {
            Some(ms) => format!("every upstream is unavailable; retry after {ms} ms"),
            None => "every upstream is unavailable".to_string(),
        });
        if let Some(ms) = pushback {
            status
                .metadata_mut()
                .insert(PUSHBACK, MetadataValue::from(ms));
        }
        status.set_source(Arc::new(exhausted));
        status
    }
}

impl From<RegistryFull> for Status {
    /// `UNAVAILABLE`, without a pushback: the registry has no room for a
    /// breaker of the call's key until one of its breakers closes. The
    /// `RegistryFull` is the status's source.
    fn from(full: RegistryFull) -> Status {
        let mut status = Status::unavailable(full.to_string());
        status.set_source(Arc::new(full));
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
        Classify::<(), _>::classify(&classifier, Err(status)).at_head()
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
    fn an_exhausted_chain_is_unavailable_with_its_smallest_pushback_or_none() {
        use crate::failover::{Reason, Unavailable};
        let open = |i, ms| {
            Unavailable::new(
                i,
                format!("p{i}"),
                Reason::open(State::Open, Some(Duration::from_millis(ms))),
            )
        };
        let status = Status::from(Exhausted::new([open(0, 4_000), open(1, 300)]));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.metadata().get(PUSHBACK).unwrap(),
            "1000",
            "the floor"
        );
        assert!(Exhausted::find(&status).is_some());
        let failed = Unavailable::new(0, "p0", Reason::failed(None, None));
        let status = Status::from(Exhausted::new([failed]));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.metadata().get(PUSHBACK).is_none());
    }

    #[test]
    fn a_full_registry_is_unavailable_without_a_pushback() {
        let registry = crate::registry::Registry::<String>::builder()
            .max_keys(1)
            .build();
        registry.get(&"a".to_string()).unwrap().force_open(None);
        let status = Status::from(registry.get(&"b".to_string()).unwrap_err());
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.metadata().get(PUSHBACK).is_none());
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
        let ok = Classify::<(), Status>::classify(&default, Ok(&())).at_head();
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
