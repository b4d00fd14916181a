//! The Lua scripts that read and change the fleet's shared state.
//!
//! Every decision that more than one instance could take at once is taken
//! inside Redis, atomically, by one script on one breaker's keys and its
//! shard's index (one hash tag, so one Cluster slot): counting a failure
//! and opening at the threshold (once enough instances are failing),
//! writing an opening, taking the probe lock, counting a probe's success
//! and closing. Times are Redis's own (key expiries and `TIME`), never an
//! instance's clock, so clock skew between instances cannot shorten or
//! stretch an open period.
//!
//! Every change of what the shard's index says (a breaker opened or
//! closed, a failure count that became non-zero or zero) writes the
//! breaker's entry in the index and adds one to the shard's version, in
//! the same script. An entry reads `o <version> <generation> <attempt>
//! <open until> <kept until>` (open) or `c <version> <failures> <until>`
//! (failures counted); `<version>` is the shard's version when it was
//! written, and times are Redis's, in milliseconds. Openings and closings
//! are also published, with the version they made.
//!
//! Every operation answers with six integers, `{kind, generation, ms,
//! attempt, failures, version}` (`version`: the shard's, which the answer
//! holds at):
//!
//! | kind | meaning | `ms` |
//! | --- | --- | --- |
//! | 0 | closed | 0 |
//! | 1 | open (or half-open when `ms` is 0, and nobody holds the probe lock for the caller) | what is left of the open period |
//! | 2 | half-open, and the caller holds the probe lock | 0 |
//! | 3 | half-open, another instance holds the probe lock | what is left of its lease |
//! | 4 | closed: the caller's opening was declined (fewer than `quorum` instances failing) | 0 |
//!
//! By job: the scripts' calls here (their keys and arguments, and the page
//! size of an index read); `lua` (the scripts' source), `answer` (their
//! answers, checked and read).

mod answer;
mod lua;

use redis::{Script, ScriptInvocation};

use super::keys::{Keys, Shard};
use crate::store::fleet::{Args, Op};
pub(crate) use answer::{control_of, parse_inspect};
use lua::{INSPECT_LUA, LUA, READ_LUA};

/// Entries asked for per page of an index read (`HSCAN`'s `COUNT`, a
/// hint: a small hash comes whole). A page of a thousand entries is about
/// 50 KB and a millisecond of Redis's time.
pub(crate) const PAGE: usize = 1000;

/// The scripts, made once per store.
pub(crate) struct Scripts {
    pub(crate) change: Script,
    pub(crate) read: Script,
    pub(crate) inspect: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            change: Script::new(LUA),
            read: Script::new(READ_LUA),
            inspect: Script::new(INSPECT_LUA),
        }
    }
}

impl Op {
    /// The operation's name in the script.
    fn name(self) -> &'static str {
        match self {
            Op::Fail => "fail",
            Op::Reset => "reset",
            Op::Open => "open",
            Op::Probe => "probe",
            Op::ProbeOk => "probe_ok",
        }
    }
}

/// Where and how the scripts publish.
#[derive(Clone, Copy)]
pub(crate) struct Publish<'a> {
    /// The single server's channel; `None` on a Cluster, where each shard
    /// publishes on its own (sharded pub/sub).
    pub(crate) channel: Option<&'a str>,
}

/// One call of the change script (`EVALSHA`, loading it first when Redis
/// has forgotten it).
pub(crate) fn invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    op: Op,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    named_invocation(scripts, keys, op.name(), names, args)
}

/// One call of the change script's `control` operation, `kind` being
/// `open_for` (with `args.open_ms`), `open`, `closed`, `disabled`,
/// `restore` or `reset` (its mark kept `args.keep_ms`).
pub(crate) fn control_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    kind: &str,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    let mut call = named_invocation(scripts, keys, "control", names, args);
    call.arg(kind);
    call
}

/// One read of everything the fleet keeps of one name.
pub(crate) fn inspect_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    escaped: &str,
) -> ScriptInvocation<'a> {
    let mut call = scripts.inspect.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    call.arg(escaped);
    call
}

fn named_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    op: &str,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    let (publish, escaped, instance, voter) = names;
    let mut call = scripts.change.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    let (channel, sharded) = match publish.channel {
        Some(channel) => (channel, "0"),
        None => (keys.shard.channel.as_str(), "1"),
    };
    call.arg(op)
        .arg(channel)
        .arg(escaped)
        .arg(args.open_ms.max(1))
        .arg(args.min_open_ms)
        .arg(args.keep_ms.max(1))
        .arg(args.attempt)
        .arg(args.known_generation)
        .arg(args.threshold.max(1))
        .arg(args.window_ms.max(1))
        .arg(args.lease_ms.max(1))
        .arg(instance)
        .arg(args.successes.max(1))
        .arg(args.quorum.max(1))
        .arg(sharded)
        .arg(voter);
    call
}

/// One read of a page of `shard`'s index, from `cursor` (0: the first).
pub(crate) fn read_invocation<'a>(
    scripts: &'a Scripts,
    shard: &Shard,
    cursor: u64,
) -> ScriptInvocation<'a> {
    let mut call = scripts.read.prepare_invoke();
    call.key(&shard.index)
        .key(&shard.version)
        .arg(cursor)
        .arg(PAGE);
    call
}
