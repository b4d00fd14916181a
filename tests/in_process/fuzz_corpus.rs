//! The fuzz targets under `cargo test`, without cargo-fuzz: every file of
//! the committed seed corpora in `fuzz/corpus/<target>/`, then a fixed
//! number of inputs from a seeded generator (random bytes, mutations of the
//! seeds, and for `retry_after` header values built from the grammar of
//! HTTP dates), through the very target bodies the fuzzer runs
//! (`fuzz/targets.rs`). A failure names the input, in hex.

use crate::common::rng;
#[path = "../../fuzz/targets.rs"]
mod targets;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use rng::SplitMix64;

/// Generated inputs per target.
const GENERATED: usize = 5_000;

/// The draws the generated inputs are made of, from the seeded generator
/// (splitmix64, `tests/common/rng.rs`).
trait Draw {
    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize;

    /// `len` random bytes.
    fn bytes(&mut self, len: usize) -> Vec<u8>;

    /// One of `items`.
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

impl Draw for SplitMix64 {
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// The seed corpus of `target`, by file name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "fuzz", "corpus", target]
        .iter()
        .collect();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("the seed corpus {}: {err}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let name = path
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let data = std::fs::read(&path).expect("a corpus file");
            (name, data)
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "the seed corpus {} is empty",
        dir.display()
    );
    files
}

/// A seed changed a little, the way a fuzzer would.
fn mutate(rng: &mut SplitMix64, seeds: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut data = rng.pick(seeds).1.clone();
    for _ in 0..=rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(6) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = *rng.pick(&[0, 1, 0x7f, 0x80, 0xff, b'9', b' ', b':', b'-']);
            }
            2 => {
                let len = rng.below(8) + 1;
                let extra = rng.bytes(len);
                data.splice(at..at, extra);
            }
            3 => data.truncate(at),
            4 => {
                // Splice in part of another seed.
                let other = &rng.pick(seeds).1;
                let from = rng.below(other.len() + 1);
                data.splice(at..at, other[from..].iter().copied());
            }
            _ => {
                if at < data.len() {
                    let end = (at + rng.below(8) + 1).min(data.len());
                    data.drain(at..end);
                }
            }
        }
    }
    data
}

/// A `Retry-After` value from the grammar of its three date forms and of
/// delay-seconds, with a mistake here and there; or, half the time, a real
/// date near `now` (see [`real_date`]).
fn header_like(rng: &mut SplitMix64) -> Vec<u8> {
    if rng.below(2) == 0 {
        return real_date(rng);
    }
    const DAYS: [&str; 5] = ["Sun", "Wed", "Sunday", "Mon,", "Xyz"];
    const MONTHS: [&str; 5] = ["Jan", "Feb", "Nov", "Dec", "Foo"];
    let number = |rng: &mut SplitMix64, digits: usize| -> String {
        match rng.below(6) {
            0 => "0".repeat(digits),
            1 => "9".repeat(digits),
            2 => String::new(),
            _ => (0..digits)
                .map(|_| char::from(b'0' + rng.below(10) as u8))
                .collect(),
        }
    };
    let time = |rng: &mut SplitMix64| {
        let fields: Vec<String> = (0..rng.below(4) + 1).map(|_| number(rng, 2)).collect();
        fields.join(":")
    };
    let text = match rng.below(4) {
        0 => {
            let day = rng.pick(&DAYS).to_string();
            let month = rng.pick(&MONTHS).to_string();
            let (d, y, t) = (number(rng, 2), number(rng, 4), time(rng));
            format!("{day}, {d} {month} {y} {t} GMT")
        }
        1 => {
            let day = rng.pick(&DAYS).to_string();
            let month = rng.pick(&MONTHS).to_string();
            let (d, y, t) = (number(rng, 2), number(rng, 2), time(rng));
            format!("{day}, {d}-{month}-{y} {t} GMT")
        }
        2 => {
            let day = rng.pick(&DAYS).to_string();
            let month = rng.pick(&MONTHS).to_string();
            let (d, t, y) = (number(rng, 1), time(rng), number(rng, 4));
            format!("{day} {month}  {d} {t} {y}")
        }
        _ => {
            let digits = rng.below(25) + 1;
            number(rng, digits)
        }
    };
    let mut now = vec![(rng.next_u64() & 1) as u8];
    let secs = match rng.below(3) {
        0 => rng.next_u64() % 4_102_444_800, // before 2100
        1 => rng.next_u64(),
        _ => 0,
    };
    now.extend_from_slice(&secs.to_le_bytes());
    now.extend_from_slice(text.as_bytes());
    now
}

/// A real date in one of its three forms (written by httpdate, so its
/// weekday is right), within a century of a `now` from 1970 to 9999, and
/// one time in four with one byte changed: the dates the parser must read
/// as httpdate reads them.
fn real_date(rng: &mut SplitMix64) -> Vec<u8> {
    const END_OF_9999: u64 = 253_402_300_799;
    const CENTURY: u64 = 100 * 366 * 86_400;
    const LONG_DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let now = rng.next_u64() % (END_OF_9999 + 1);
    let low = now.saturating_sub(CENTURY);
    let high = (now + CENTURY).min(END_OF_9999);
    let at = low + rng.next_u64() % (high - low + 1);
    let imf = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(at));
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let (weekday, day, month, year, time) = (
        &imf[0..3],
        &imf[5..7],
        &imf[8..11],
        &imf[12..16],
        &imf[17..25],
    );
    let mut text = match rng.below(3) {
        0 => imf.clone(),
        1 => {
            let long = LONG_DAYS
                .iter()
                .find(|d| d.starts_with(weekday))
                .expect("a weekday");
            format!("{long}, {day}-{month}-{} {time} GMT", &year[2..])
        }
        _ => {
            let day = match day.strip_prefix('0') {
                Some(digit) if rng.below(2) == 0 => format!(" {digit}"),
                _ => day.to_owned(),
            };
            format!("{weekday} {month} {day} {time} {year}")
        }
    }
    .into_bytes();
    if rng.below(4) == 0 {
        let at = rng.below(text.len());
        text[at] = 0x20 + rng.below(0x5f) as u8;
    }
    let mut data = vec![0];
    data.extend_from_slice(&now.to_le_bytes());
    data.extend_from_slice(&text);
    data
}

/// A config file, in TOML or JSON, from the fields a config has, with
/// values of every kind a file may hold: good ones, bad ones, edges.
#[cfg(feature = "serde")]
fn config_text(rng: &mut SplitMix64) -> Vec<u8> {
    const DURATIONS: [&str; 16] = [
        "\"30s\"",
        "\"0s\"",
        "\"250ms\"",
        "\"1m30s\"",
        "\"365d\"",
        "\"366d\"",
        "\"18446744073709551615ms\"",
        "\"18446744073709551616ms\"",
        "\"none\"",
        "\"5x\"",
        "\"-5s\"",
        "\"\"",
        "30",
        "\"1d2h3m4s5ms\"",
        "\"30s1m\"",
        "\"1.5s\"",
    ];
    const NUMBERS: [&str; 14] = [
        "0",
        "1",
        "2",
        "0.5",
        "1.0",
        "1000",
        "1e308",
        "-1",
        "nan",
        "4294967295",
        "4294967296",
        "1048576",
        "0.999999",
        "\"3\"",
    ];
    const FIELDS: [(&str, bool); 11] = [
        ("name", false),
        ("cooldown", true),
        ("min_open", true),
        ("max_open", true),
        ("backoff", false),
        ("jitter", false),
        ("probes", false),
        ("successes_to_close", false),
        ("probe_timeout", true),
        ("probe_interval", true),
        ("cooldwn", true),
    ];
    /// Two times in three one of the first `good` values, which a config
    /// mostly accepts, so that many files get past the checks.
    fn pick_mostly_good(rng: &mut SplitMix64, values: &[&str], good: usize) -> String {
        let values = if rng.below(3) == 0 {
            values
        } else {
            &values[..good]
        };
        rng.pick(values).to_string()
    }
    fn table(fields: Vec<(String, String)>, json: bool) -> String {
        let sep = if json { ": " } else { " = " };
        let body: Vec<String> = fields
            .into_iter()
            .map(|(k, v)| {
                let k = if json { format!("\"{k}\"") } else { k };
                format!("{k}{sep}{v}")
            })
            .collect();
        format!("{{ {} }}", body.join(", "))
    }
    fn policy(rng: &mut SplitMix64, json: bool, depth: usize) -> String {
        let duration = |rng: &mut SplitMix64| pick_mostly_good(rng, &DURATIONS, 4);
        let number = |rng: &mut SplitMix64| pick_mostly_good(rng, &NUMBERS, 6);
        let (name, fields): (&str, Vec<(&str, String)>) =
            match rng.below(if depth < 2 { 6 } else { 5 }) {
                0 => ("consecutive_failures", vec![("threshold", number(rng))]),
                1 => (
                    "count_window",
                    vec![
                        ("failures", number(rng)),
                        ("window", number(rng)),
                        ("stale_after", duration(rng)),
                    ],
                ),
                2 => (
                    "time_window",
                    vec![
                        ("window", duration(rng)),
                        ("buckets", number(rng)),
                        ("min_calls", number(rng)),
                        ("failure_rate", number(rng)),
                    ],
                ),
                3 => {
                    let over_time = table(
                        vec![
                            ("length".to_string(), duration(rng)),
                            ("buckets".to_string(), number(rng)),
                        ],
                        json,
                    );
                    (
                        "slow_calls",
                        vec![
                            ("slower_than", duration(rng)),
                            ("rate", number(rng)),
                            ("over_calls", number(rng)),
                            ("over_time", over_time),
                            ("min_calls", number(rng)),
                        ],
                    )
                }
                4 => {
                    let mut fields = vec![
                        ("false_trips_per_million", number(rng)),
                        ("min_degradation", number(rng)),
                        ("warm_up", number(rng)),
                        ("ceiling", number(rng)),
                        ("baseline_horizon", number(rng)),
                    ];
                    if depth < 2 {
                        fields.push(("fallback", policy(rng, json, depth + 1)));
                    }
                    ("adaptive", fields)
                }
                _ => {
                    let members: Vec<String> = (0..rng.below(3))
                        .map(|_| policy(rng, json, depth + 1))
                        .collect();
                    return table(
                        vec![("any_of".to_string(), format!("[{}]", members.join(", ")))],
                        json,
                    );
                }
            };
        let fields = fields
            .into_iter()
            .filter(|_| rng.below(4) != 0)
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        table(vec![(name.to_string(), table(fields, json))], json)
    }
    let json = rng.below(2) == 0;
    let mut fields: Vec<(String, String)> = Vec::new();
    for (field, is_duration) in FIELDS {
        if rng.below(3) == 0 {
            let value = match (field, is_duration) {
                ("name", _) => "\"openai/gpt-x\"".to_string(),
                (_, true) => pick_mostly_good(rng, &DURATIONS, 4),
                (_, false) => pick_mostly_good(rng, &NUMBERS, 6),
            };
            fields.push((field.to_string(), value));
        }
    }
    if rng.below(2) == 0 {
        fields.push(("trip".to_string(), policy(rng, json, 0)));
    }
    let text = match (json, rng.below(3)) {
        (true, 0) => format!(
            "{{\"default\": {}, \"keys\": {{\"a\": {}}}}}",
            table(fields.clone(), true),
            table(fields, true)
        ),
        (true, _) => table(fields, true),
        (false, 0) => {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            format!(
                "[default]\n{}\n[keys.\"a\"]\n{}\n",
                body.join("\n"),
                body.join("\n")
            )
        }
        (false, _) => {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            body.join("\n")
        }
    };
    text.into_bytes()
}

/// Runs `target` over the corpus and `GENERATED` more inputs; fails with
/// every input that panicked.
fn replay(
    name: &str,
    target: fn(&[u8]),
    seed: u64,
    structured: Option<fn(&mut SplitMix64) -> Vec<u8>>,
) {
    let seeds = corpus(name);
    let mut rng = SplitMix64(seed);
    let mut inputs: Vec<(String, Vec<u8>)> = seeds.clone();
    for i in 0..GENERATED {
        let data = match (i % 3, structured) {
            (0, _) => {
                let longest = if rng.below(4) == 0 { 512 } else { 64 };
                let len = rng.below(longest);
                rng.bytes(len)
            }
            (1, Some(make)) => make(&mut rng),
            _ => mutate(&mut rng, &seeds),
        };
        inputs.push((format!("generated #{i}"), data));
    }
    let mut failures = Vec::new();
    for (what, data) in &inputs {
        if catch_unwind(AssertUnwindSafe(|| target(data))).is_err() {
            let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
            failures.push(format!("{what}: {hex}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} inputs panicked:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
    eprintln!(
        "{name}: {} seed files and {GENERATED} generated inputs; {} valid configs exercised so far",
        seeds.len(),
        targets::EXERCISED.load(std::sync::atomic::Ordering::Relaxed),
    );
}

#[test]
fn retry_after_never_panics_and_stays_in_range() {
    replay(
        "retry_after",
        targets::retry_after,
        0x7e7a1,
        Some(header_like),
    );
}

#[test]
fn any_config_builds_or_is_refused_and_its_breaker_survives() {
    replay("config", targets::config, 0xc0f19, None);
}

#[cfg(feature = "serde")]
#[test]
fn any_config_file_reads_or_is_refused_without_panicking() {
    replay(
        "config_file",
        targets::config_file,
        0xf11e,
        Some(config_text),
    );
}

#[cfg(feature = "http-body")]
#[test]
fn grpc_status_and_pushback_never_panic_and_only_failures_carry_a_hint() {
    replay("grpc_headers", targets::grpc_headers, 0x9c5, None);
}
