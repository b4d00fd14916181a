//! The view against reads, answers and published news: only what changed
//! is told, older news never overrides newer, an unbroken run of
//! published changes keeps a shard complete, controls live under their own
//! field, unreadable entries are skipped, and a read in pages stands for
//! its first page's version.

use redis::Value;

use super::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn read(version: u64, entries: &[(&str, &str)]) -> ShardRead {
    page(version, 0, entries).0
}

fn page(version: u64, cursor: u64, entries: &[(&str, &str)]) -> (ShardRead, u64) {
    let mut items = vec![
        bulk(&version.to_string()),
        bulk("1000000"),
        bulk(&cursor.to_string()),
    ];
    for (name, entry) in entries {
        items.push(bulk(name));
        items.push(bulk(entry));
    }
    ShardRead::parse(&Value::Array(items), Instant::now()).expect("a read")
}

#[test]
fn a_read_tells_of_what_changed_and_only_that() {
    let mut view = View::new(1);
    assert!(view.is_behind(0, 0), "never read");
    let changed = view.install(
        0,
        read(
            5,
            &[("a", "o 5 7 0 1000300 1060000"), ("b", "c 3 2 1060000")],
        ),
    );
    assert_eq!(changed.len(), 2);
    assert!(!view.is_behind(0, 5));
    let now = Instant::now();
    assert!(matches!(
        view.reply(0, "a", now),
        Reply::Open {
            generation: 7,
            left_ms: 1..=300,
            attempt: 0
        }
    ));
    assert_eq!(view.reply(0, "b", now), Reply::Closed { failures: 2 });
    assert_eq!(view.reply(0, "c", now), Reply::Closed { failures: 0 });
    // The same state again at a later version: nothing to tell; `a`
    // closed: that.
    let changed = view.install(0, read(7, &[("b", "c 6 3 1060000")]));
    assert_eq!(changed, vec![Arc::from("a")]);
}

#[test]
fn older_news_never_overrides_newer() {
    let mut view = View::new(1);
    view.install(0, read(10, &[("a", "o 10 7 0 1000300 1060000")]));
    let now = Instant::now();
    // The probe that closed `a` answered at version 12...
    assert!(view.learn(0, "a", 12, Known::of(Reply::Closed { failures: 0 }, now)));
    // ...before the message of its reopening at 11 came: stale.
    let reopened = Known::of(
        Reply::Open {
            generation: 8,
            left_ms: 300,
            attempt: 1,
        },
        now,
    );
    assert!(!view.heard(0, "a", 11, reopened));
    assert_eq!(view.reply(0, "a", now), Reply::Closed { failures: 0 });
    // A read made before the closing does not bring it back either.
    view.install(0, read(11, &[("a", "o 11 8 1 1000300 1060000")]));
    assert_eq!(view.reply(0, "a", now), Reply::Closed { failures: 0 });
    // Once a read covers the closing, its mark is gone.
    view.install(0, read(12, &[]));
    assert!(view.shards[0].entries.is_empty());
}

#[test]
fn published_changes_in_an_unbroken_run_keep_the_view_complete() {
    let mut view = View::new(1);
    view.install(0, read(3, &[]));
    let open = Known::of(
        Reply::Open {
            generation: 1,
            left_ms: 100,
            attempt: 0,
        },
        Instant::now(),
    );
    assert!(view.heard(0, "a", 4, open));
    assert!(!view.is_behind(0, 4), "4 follows 3");
    // A change nobody published (a count) in between: behind.
    view.heard(0, "b", 6, open);
    assert!(view.is_behind(0, 6));
    assert!(view.open().count() == 2);
}

#[test]
fn a_control_is_read_under_its_field_and_gone_once_a_read_lacks_it() {
    let mut view = View::new(1);
    let changed = view.install(
        0,
        read(
            4,
            &[
                ("!a", "x 3 open 9999999999"),
                ("a", "c 2 1 1060000"),
                ("!b", "x 4 reset 1060000"),
            ],
        ),
    );
    assert_eq!(changed.len(), 3);
    assert_eq!(view.control(0, "a"), Some((3, Control::ForceOpen(None))));
    assert_eq!(view.control(0, "b"), Some((4, Control::Reset)));
    assert_eq!(view.control(0, "c"), None);
    // The name's own entry is apart from its control.
    assert_eq!(
        view.reply(0, "a", Instant::now()),
        Reply::Closed { failures: 1 }
    );
    // Restored: the next read lacks it.
    let changed = view.install(0, read(6, &[("a", "c 2 1 1060000")]));
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(view.control(0, "a"), None);
    assert_eq!(controlled_name("!a"), Some("a"));
    assert_eq!(controlled_name("a"), None);
}

#[test]
fn unreadable_entries_are_counted_and_skipped() {
    let r = read(2, &[("a", "o 2 x"), ("b", "z 2"), ("c", "c 2 1 1060000")]);
    assert_eq!(r.unreadable, 2);
    assert_eq!(r.entries.len(), 1);
    assert!(ShardRead::parse(&Value::Okay, Instant::now()).is_none());
    assert!(ShardRead::parse(&Value::Array(vec![bulk("1")]), Instant::now()).is_none());
    let no_cursor = Value::Array(vec![bulk("1"), bulk("1000000"), bulk("x")]);
    assert!(ShardRead::parse(&no_cursor, Instant::now()).is_none());
}

#[test]
fn a_read_in_pages_holds_its_first_pages_version_and_every_page() {
    let (mut first, cursor) = page(5, 17, &[("a", "o 5 7 0 1000300 1060000")]);
    assert_eq!(cursor, 17, "more to come");
    // A change made while the pages were read comes with its own,
    // later, version.
    let (second, cursor) = page(6, 0, &[("b", "c 6 2 1060000")]);
    assert_eq!(cursor, 0, "the last page");
    first.extend(second);
    let mut view = View::new(1);
    let changed = view.install(0, first);
    assert_eq!(changed.len(), 2);
    // The read stands for version 5: the shard, now at 6, is read
    // again.
    assert!(view.is_behind(0, 6));
    assert!(!view.is_behind(0, 5));
    assert_eq!(
        view.reply(0, "b", Instant::now()),
        Reply::Closed { failures: 2 }
    );
}
