//! An operator's requests by name: a fleet-wide control, carried out in
//! Redis and here at once (the other instances hear it published, or read
//! it in the index at their next refresh), and a read of everything the
//! fleet keeps of a name.

use std::time::Duration;

use tokio::sync::oneshot;

use super::*;
use crate::store::redis::script::{control_invocation, inspect_invocation, parse_inspect};
use crate::store::redis::view::{control_field, controlled_name};
use crate::store::{FleetError, FleetState};
use crate::Control;

/// What a store handle asks of its task.
pub(crate) enum Request {
    /// A breaker to share.
    Attach(Attached),
    /// A fleet-wide control of the name `escaped`.
    Control {
        escaped: Arc<str>,
        control: Control,
        answer: oneshot::Sender<Result<(), FleetError>>,
    },
    /// A read of the fleet's state of the name `escaped`.
    Inspect {
        escaped: Arc<str>,
        answer: oneshot::Sender<Result<FleetState, FleetError>>,
    },
}

/// How long the mark of a fleet-wide reset stays in the index, for the
/// instances that read it rather than hear it: ten refresh intervals, and
/// at least a minute.
fn reset_mark(refresh: Duration) -> Duration {
    refresh.saturating_mul(10).max(Duration::from_secs(60))
}

impl Task {
    /// Carries out `request`.
    pub(super) async fn take(&mut self, request: Request) {
        match request {
            Request::Attach(attached) => self.add(attached),
            Request::Control {
                escaped,
                control,
                answer,
            } => {
                let done = self.control(&escaped, control).await;
                let _ = answer.send(done);
            }
            Request::Inspect { escaped, answer } => {
                let state = self.inspect(&escaped).await;
                let _ = answer.send(state);
            }
        }
    }

    /// A fleet-wide control of `escaped`: written to its shard in one
    /// script (which publishes it), then taken into the view and carried
    /// out on this instance's breakers.
    async fn control(&mut self, escaped: &Arc<str>, control: Control) -> Result<(), FleetError> {
        let shard = keys::shard_of(escaped, self.shards);
        if self.is_down() || self.is_cut(shard) {
            return Err(FleetError::new(
                "Redis does not answer for the shard of this name",
            ));
        }
        let lease = self.timing.lease;
        let (kind, args) = match control {
            Control::ForceOpen(Some(period)) => (
                "open_for",
                Args {
                    open_ms: millis(period),
                    keep_ms: millis(period)
                        .saturating_add(60_000)
                        .saturating_add(millis(lease)),
                    ..Args::default()
                },
            ),
            Control::ForceOpen(None) => ("open", Args::default()),
            Control::ForceClosed => ("closed", Args::default()),
            Control::Disable => ("disabled", Args::default()),
            Control::Restore => ("restore", Args::default()),
            Control::Reset => (
                "reset",
                Args {
                    keep_ms: millis(reset_mark(self.timing.refresh)),
                    ..Args::default()
                },
            ),
        };
        let mut conn = self.conn().await.map_err(unreached)?;
        let keys = Keys::new(&self.prefix, escaped, self.shards);
        let publish = Publish {
            channel: self.channel.as_deref(),
        };
        let names = (
            publish,
            &**escaped,
            self.instance.as_str(),
            self.voter.as_str(),
        );
        let call = control_invocation(&self.scripts, &keys, kind, names, &args);
        let value = bounded(self.timing.command_timeout, conn.invoke(&call))
            .await
            .map_err(unreached)?;
        let (reply, version) =
            Reply::parse(&value).ok_or_else(|| FleetError::new(format!("{value:?}")))?;
        let now = Instant::now();
        let field = control_field(escaped);
        let held = match control {
            Control::ForceOpen(Some(_)) | Control::Restore => Known::Closed,
            control => Known::Controlled {
                control,
                id: version,
            },
        };
        self.view.learn(shard, &field, version, held);
        if control == Control::Reset || matches!(control, Control::ForceOpen(Some(_))) {
            self.view
                .learn(shard, escaped, version, Known::of(reply, now));
        }
        self.apply_control(escaped);
        if matches!(control, Control::ForceOpen(Some(_))) {
            self.apply(escaped, reply);
        }
        tracing::info!(store = "redis", key = %escaped, control = control.name(), "fleet-wide control");
        Ok(())
    }

    /// Brings the local breakers of `escaped` in line with the fleet's
    /// control of it, as the view knows it.
    pub(super) fn apply_control(&mut self, escaped: &str) {
        let shard = keys::shard_of(escaped, self.shards);
        let control = self.view.control(shard, escaped);
        if let Some(entry) = self.entries.get_mut(escaped) {
            entry.local.control(control);
            self.reschedule(escaped);
        }
    }

    /// Brings the local breakers of what a change names in line with the
    /// view: a name's state, or (for a control's field) its control.
    pub(super) fn apply_change(&mut self, shard: u16, field: &str, now: Instant) {
        match controlled_name(field) {
            Some(escaped) => self.apply_control(escaped),
            None if self.entries.contains_key(field) => {
                let reply = self.view.reply(shard, field, now);
                self.apply(field, reply);
            }
            None => {}
        }
    }

    /// A published control of `escaped`, at `version`.
    pub(super) fn heard_control(&mut self, escaped: &str, version: u64, kind: &str) {
        let shard = keys::shard_of(escaped, self.shards);
        let held = match kind {
            "restore" => Known::Closed,
            "reset" => Known::Controlled {
                control: Control::Reset,
                id: version,
            },
            kind => match crate::store::redis::script::control_of(kind) {
                Some(control) => Known::Controlled {
                    control,
                    id: version,
                },
                None => return,
            },
        };
        if kind == "reset" {
            self.view.heard(shard, escaped, version, Known::Closed);
        }
        if self
            .view
            .heard(shard, &control_field(escaped), version, held)
        {
            self.apply_control(escaped);
        }
    }

    /// Everything the fleet keeps of `escaped`, read now.
    async fn inspect(&mut self, escaped: &str) -> Result<FleetState, FleetError> {
        let shard = keys::shard_of(escaped, self.shards);
        if self.is_down() || self.is_cut(shard) {
            return Err(FleetError::new(
                "Redis does not answer for the shard of this name",
            ));
        }
        let keys = Keys::new(&self.prefix, escaped, self.shards);
        let mut conn = self.conn().await.map_err(unreached)?;
        let call = inspect_invocation(&self.scripts, &keys, escaped);
        let value = bounded(self.timing.command_timeout, conn.invoke(&call))
            .await
            .map_err(unreached)?;
        parse_inspect(&value)
            .ok_or_else(|| FleetError::new(format!("an answer of another shape: {value:?}")))
    }
}

fn unreached(error: RedisError) -> FleetError {
    FleetError::new(error.to_string())
}
