//! Byte scanners for streamed bodies: each reads a body piece by piece as it
//! passes, holding only its place (a few bytes of state), never the bytes.
//! A piece may end anywhere, in a field name, a JSON string, a `\r\n`: the
//! answer is the same however the body is cut.

use std::time::Duration;

/// Finds error events in a stream of server-sent events: an `event: error`
/// line, or a `data:` line whose JSON object has a top-level `error` that is
/// neither `null` nor `false`. An event's `data:` lines are one JSON text,
/// as the SSE format joins them.
#[derive(Clone, Debug, Default)]
pub(crate) struct SseScan {
    line: Line,
    json: Json,
    /// The last byte ended a line with `\r`: a `\n` next ends nothing more.
    after_cr: bool,
}

/// Where the scanner is in the current line.
#[derive(Clone, Copy, Debug)]
enum Line {
    /// In the field name: `len` bytes so far, and whether they still spell
    /// the start of `event` and of `data`.
    Field { len: u8, event: bool, data: bool },
    /// In an `event:` value: how much of `error` it matches (`None`: it is
    /// something else), and whether its first byte has come.
    Event { matched: Option<u8>, started: bool },
    /// In a `data:` value, its first byte come or not.
    Data { started: bool },
    /// The rest of the line says nothing.
    Skip,
}

impl Default for Line {
    fn default() -> Self {
        Line::Field {
            len: 0,
            event: true,
            data: true,
        }
    }
}

const EVENT: &[u8] = b"event";
const DATA: &[u8] = b"data";
const ERROR: &[u8] = b"error";

impl SseScan {
    /// Reads the next piece of the stream: true when it completes an error
    /// event.
    ///
    /// Most bytes move nothing. A whole event in one piece whose data line
    /// holds no `"error"` is passed over in one pass ([`event_end`]): a
    /// provider's usual chunk. Otherwise the rest of a line that is neither
    /// `data:` nor `event:`, the inside of a JSON string that is no
    /// top-level key, and the data after the top-level object are skipped
    /// eight bytes at a time ([`first_of`]), and every other byte goes
    /// through the state machine one at a time. Byte by byte throughout, a
    /// 133-byte chat-completion chunk took about 5,950 instructions; this
    /// way, about 870 (callgrind, the hot-path bench's `streams` rows).
    pub(crate) fn feed(&mut self, piece: &[u8]) -> bool {
        let mut at = 0;
        if let Some(&first) = piece.first() {
            // A `\n` right after the `\r` that ended the last piece's line
            // ends nothing more.
            if std::mem::take(&mut self.after_cr) && first == b'\n' {
                at = 1;
            }
        }
        while let Some(&byte) = piece.get(at) {
            if is_line_end(byte) {
                if self.end_line() {
                    return true;
                }
                at += 1;
                if byte == b'\r' {
                    match piece.get(at) {
                        Some(b'\n') => at += 1,
                        Some(_) => {}
                        None => self.after_cr = true,
                    }
                }
                continue;
            }
            let rest = &piece[at..];
            match self.line {
                Line::Skip => match first_of(rest, LINE_ENDS) {
                    Some(end) => at += end,
                    None => return false,
                },
                Line::Data { started: true } => {
                    if let Some(event_end) = self.json.fresh().then(|| event_end(rest)).flatten() {
                        // The whole event is here and the line holds no
                        // `"error"`: nothing in it can be the error, and
                        // the blank line after it forgets the JSON.
                        self.line = Line::default();
                        at += event_end;
                        continue;
                    }
                    match self.json.scan(rest) {
                        Scanned::Read(read) => at += read,
                        Scanned::Error => return true,
                    }
                }
                // The common line starts, at once rather than six steps.
                Line::Field { len: 0, .. } if rest.starts_with(b"data: ") => {
                    self.line = Line::Data { started: true };
                    at += b"data: ".len();
                }
                Line::Field { len: 0, .. } if rest.starts_with(b"data:") => {
                    self.line = Line::Data { started: false };
                    at += DATA.len() + 1;
                }
                _ => {
                    if self.in_line(byte) {
                        return true;
                    }
                    at += 1;
                }
            }
        }
        false
    }

    /// A line ended: an `event: error` line is an error event; an empty
    /// line ends the event, and its data with it.
    fn end_line(&mut self) -> bool {
        let line = std::mem::take(&mut self.line);
        match line {
            Line::Field { len: 0, .. } => {
                self.json = Json::default();
                false
            }
            Line::Event { matched, .. } => matched == Some(ERROR.len() as u8),
            _ => false,
        }
    }

    fn in_line(&mut self, byte: u8) -> bool {
        match &mut self.line {
            Line::Field { len, event, data } => {
                let at = usize::from(*len);
                if byte == b':' {
                    self.line = if *event && at == EVENT.len() {
                        Line::Event {
                            matched: Some(0),
                            started: false,
                        }
                    } else if *data && at == DATA.len() {
                        Line::Data { started: false }
                    } else {
                        Line::Skip
                    };
                    return false;
                }
                *event &= EVENT.get(at) == Some(&byte);
                *data &= DATA.get(at) == Some(&byte);
                *len = len.saturating_add(1);
                if !*event && !*data {
                    self.line = Line::Skip;
                }
                false
            }
            Line::Event { matched, started } => {
                // One space after the colon belongs to no value.
                if !std::mem::replace(started, true) && byte == b' ' {
                    return false;
                }
                *matched = matched
                    .and_then(|m| (ERROR.get(usize::from(m)) == Some(&byte)).then_some(m + 1));
                if matched.is_none() {
                    // No longer `error`: the rest says nothing, as a skipped
                    // line's (neither ends the event).
                    self.line = Line::Skip;
                }
                false
            }
            Line::Data { started } => {
                if !std::mem::replace(started, true) && byte == b' ' {
                    return false;
                }
                self.json.byte(byte)
            }
            Line::Skip => false,
        }
    }
}

/// Where a JSON scanner is in one JSON text: enough to tell the keys of
/// the top-level object, and the first byte of the value after `error`.
#[derive(Clone, Copy, Debug, Default)]
struct Json {
    phase: Phase,
    depth: u16,
    in_string: bool,
    escaped: bool,
    /// At the top level, the next string is a key.
    expect_key: bool,
    /// In a top-level key: how much of `error` it matches (`None`: not it,
    /// or no key).
    key: Option<u8>,
    /// The top-level key `error` was read: its value is next.
    error_value: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Before the text: blanks, then `{` or something else.
    #[default]
    Before,
    /// Inside the top-level object.
    Object,
    /// Past it, or the text is no object: nothing more to see.
    Done,
}

/// What [`Json::scan`] read of a data line.
enum Scanned {
    /// This many bytes, up to the line's end or the piece's, no error.
    Read(usize),
    /// The first byte of a top-level `error`'s value.
    Error,
}

impl Json {
    /// No top-level key is being read, and none just was: the JSON can only
    /// find an error in bytes that spell `"error"` (a key is matched from
    /// its opening quote to its closing one, an escape ending the match).
    fn fresh(&self) -> bool {
        self.key.is_none() && !self.error_value
    }

    /// Reads a data line's bytes up to its end (a `\r` or `\n`, not read)
    /// or the piece's.
    fn scan(&mut self, bytes: &[u8]) -> Scanned {
        let mut at = 0;
        loop {
            match self.phase {
                Phase::Done => {
                    let rest = bytes.get(at..).unwrap_or_default();
                    return Scanned::Read(at + first_of(rest, LINE_ENDS).unwrap_or(rest.len()));
                }
                Phase::Object if !self.escaped && self.key.is_none() && !self.error_value => {
                    at = self.skim(bytes, at);
                }
                _ => {}
            }
            // What the skim left: a byte for the whole machine.
            let Some(&byte) = bytes.get(at) else { break };
            if is_line_end(byte) {
                break;
            }
            if self.byte(byte) {
                return Scanned::Error;
            }
            at += 1;
        }
        Scanned::Read(at)
    }

    /// Reads `bytes` from `at` while nothing but the depth and whether it
    /// is in a string can change: below the top level, outside any key and
    /// escape. Where it stops (at a byte of the top level, a line end, an
    /// escape at the line's or the piece's end, or the piece's end) the
    /// whole machine takes over, a byte at a time.
    #[inline]
    fn skim(&mut self, bytes: &[u8], mut at: usize) -> usize {
        let mut depth = self.depth;
        let mut in_string = self.in_string;
        loop {
            let rest = bytes.get(at..).unwrap_or_default();
            if in_string {
                // Only a string's end, an escape or the line's end matters.
                let Some(stop) = first_of(rest, STRING_STOPS) else {
                    at = bytes.len();
                    break;
                };
                at += stop;
                match (rest.get(stop), rest.get(stop + 1)) {
                    (Some(b'"'), _) => {
                        in_string = false;
                        at += 1;
                    }
                    // The escaped byte goes with it, unless the line ends.
                    (Some(b'\\'), Some(&next)) if !is_line_end(next) => at += 2,
                    _ => break,
                }
                continue;
            }
            let Some(&byte) = rest.first() else { break };
            match byte {
                b'"' if depth > 1 => in_string = true,
                b'{' | b'[' => depth = depth.saturating_add(1),
                b'}' | b']' if depth > 1 => depth -= 1,
                b'"' | b'}' | b']' | b':' | b',' if depth == 1 => break,
                b'\r' | b'\n' => break,
                _ => {}
            }
            at += 1;
        }
        self.depth = depth;
        self.in_string = in_string;
        at
    }

    /// Reads one byte: true when it is the first of a top-level `error`'s
    /// value that is neither `null` nor `false`.
    fn byte(&mut self, byte: u8) -> bool {
        match self.phase {
            Phase::Done => false,
            Phase::Before => {
                match byte {
                    b' ' | b'\t' | b'\n' | b'\r' => {}
                    b'{' => {
                        self.phase = Phase::Object;
                        self.depth = 1;
                        self.expect_key = true;
                    }
                    _ => self.phase = Phase::Done,
                }
                false
            }
            Phase::Object if self.in_string => {
                if std::mem::take(&mut self.escaped) {
                    self.key = None;
                } else if byte == b'\\' {
                    self.escaped = true;
                    self.key = None;
                } else if byte == b'"' {
                    self.in_string = false;
                    self.error_value = self.key == Some(ERROR.len() as u8);
                    self.key = None;
                } else {
                    self.key = self
                        .key
                        .and_then(|m| (ERROR.get(usize::from(m)) == Some(&byte)).then_some(m + 1));
                }
                false
            }
            Phase::Object => {
                if self.error_value && !matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b':') {
                    self.error_value = false;
                    if !matches!(byte, b'n' | b'f') {
                        return true;
                    }
                }
                self.structure(byte);
                false
            }
        }
    }

    /// Reads one byte of the top-level object outside its strings: the
    /// brackets, the quotes and, at the top level, the separators.
    #[inline]
    fn structure(&mut self, byte: u8) {
        let top = self.depth == 1;
        match byte {
            b'"' => {
                self.in_string = true;
                self.key = (top && self.expect_key).then_some(0);
            }
            b'{' | b'[' => self.depth = self.depth.saturating_add(1),
            b'}' | b']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    self.phase = Phase::Done;
                }
            }
            b':' if top => self.expect_key = false,
            b',' if top => self.expect_key = true,
            _ => {}
        }
    }
}

fn is_line_end(byte: u8) -> bool {
    byte == b'\r' || byte == b'\n'
}

/// What ends a line.
const LINE_ENDS: [u8; 2] = [b'\r', b'\n'];
/// What ends a run of a string's bytes: its end, an escape, the line's end.
const STRING_STOPS: [u8; 4] = [b'"', b'\\', b'\r', b'\n'];

/// A top-level key `error`, quotes included: what a line must hold for its
/// JSON to be an error.
const QUOTED_ERROR: &[u8] = b"\"error\"";

/// Where the blank line that ends the event begins, if the line at the
/// start of `bytes` ends in them, holds no `"error"`, and the blank line
/// follows it in them too. One pass, eight bytes at a time: the line's end,
/// and every quote followed by an `e` as a candidate, checked whole.
fn event_end(bytes: &[u8]) -> Option<usize> {
    let error_at = |at: usize| {
        bytes
            .get(at..)
            .is_some_and(|rest| rest.starts_with(QUOTED_ERROR))
    };
    let mut at = 0;
    let line_end = loop {
        let Some(nine) = bytes.get(at..).and_then(<[u8]>::first_chunk::<9>) else {
            // The last few bytes, one at a time.
            let end = at
                + bytes
                    .get(at..)?
                    .iter()
                    .position(|&byte| is_line_end(byte))?;
            if (at..end).any(error_at) {
                return None;
            }
            break end;
        };
        let word = u64::from_le_bytes(*nine.first_chunk::<8>()?);
        let next = u64::from_le_bytes(*nine.last_chunk::<8>()?);
        let ends = zero_bytes(word ^ (LOW_BITS * u64::from(b'\r')))
            | zero_bytes(word ^ (LOW_BITS * u64::from(b'\n')));
        // Every quote followed by an `e` is flagged (and a few more, above
        // a true one: the candidates are checked whole).
        let mut candidates = zero_bytes(word ^ (LOW_BITS * u64::from(b'"')))
            & zero_bytes(next ^ (LOW_BITS * u64::from(b'e')));
        let end = (ends != 0).then(|| at + (ends.trailing_zeros() / 8) as usize);
        while candidates != 0 {
            let candidate = at + (candidates.trailing_zeros() / 8) as usize;
            if end.is_some_and(|end| candidate >= end) {
                break;
            }
            if error_at(candidate) {
                return None;
            }
            candidates &= candidates - 1;
        }
        if let Some(end) = end {
            break end;
        }
        at += 8;
    };
    // The line's end (a `\r\n` as one), then the blank line's.
    let crlf = bytes.get(line_end..line_end + 2) == Some(b"\r\n");
    let blank = line_end + 1 + usize::from(crlf);
    bytes
        .get(blank)
        .is_some_and(|&byte| is_line_end(byte))
        .then_some(blank)
}

/// One in each byte of a word.
const LOW_BITS: u64 = u64::from_le_bytes([0x01; 8]);
/// The high bit of each byte of a word.
const HIGH_BITS: u64 = u64::from_le_bytes([0x80; 8]);

/// Where the first of `stops` is in `bytes`, eight bytes at a time (a word
/// compared with each stop at once: no dependency on `memchr` in the
/// core, and LLVM does not vectorise a byte loop whose length it does
/// not know).
#[inline]
fn first_of<const N: usize>(bytes: &[u8], stops: [u8; N]) -> Option<usize> {
    let mut at = 0;
    while let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*word);
        let hits = stops.iter().fold(0, |hits, &stop| {
            hits | zero_bytes(word ^ (LOW_BITS * u64::from(stop)))
        });
        if hits != 0 {
            // Little-endian: the lowest flagged byte comes first.
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    tail.iter()
        .position(|byte| stops.contains(byte))
        .map(|i| at + i)
}

/// The zero bytes of `word`, by their high bit. Above the lowest zero byte
/// a borrow may flag a byte that is not zero, so only the lowest flag is
/// exact; then the lowest flag of several stops' hits put together is still
/// the first stop: every false flag lies above a true one of its own stop.
#[inline]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(LOW_BITS) & !word & HIGH_BITS
}

/// Finds the first `"retryDelay": "<seconds>s"` in a JSON body (Google's
/// `google.rpc.RetryInfo`, as Gemini's errors carry it): `52s`, `1.5s`.
/// Anything else after the key gives nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct RetryDelayScan {
    state: Delay,
    /// The seconds so far, in milliseconds, and the fraction's scale.
    millis: u64,
    fraction: Option<u64>,
    found: Option<Duration>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Delay {
    /// Looking for the key: how much of `"retryDelay"` matches.
    #[default]
    Key,
    Matched(u8),
    /// After the key: blanks and a colon, then the value's quote.
    Colon,
    Quote,
    /// In the value's digits.
    Digits,
    /// After its `s`: the closing quote.
    Unit,
}

const RETRY_DELAY: &[u8] = b"\"retryDelay\"";

impl RetryDelayScan {
    /// Reads the next piece of the body.
    pub(crate) fn feed(&mut self, piece: &[u8]) {
        if self.found.is_none() {
            for &byte in piece {
                self.byte(byte);
            }
        }
    }

    /// The delay read, if any.
    pub(crate) fn delay(&self) -> Option<Duration> {
        self.found
    }

    fn byte(&mut self, byte: u8) {
        self.state = match self.state {
            Delay::Key | Delay::Matched(_) => {
                let at = match self.state {
                    Delay::Matched(m) => usize::from(m),
                    _ => 0,
                };
                if RETRY_DELAY[at] == byte {
                    if at + 1 == RETRY_DELAY.len() {
                        Delay::Colon
                    } else {
                        Delay::Matched(at as u8 + 1)
                    }
                } else if byte == b'"' {
                    Delay::Matched(1)
                } else {
                    Delay::Key
                }
            }
            Delay::Colon => match byte {
                b' ' | b'\t' | b'\n' | b'\r' => Delay::Colon,
                b':' => Delay::Quote,
                _ => Delay::Key,
            },
            Delay::Quote => match byte {
                b' ' | b'\t' | b'\n' | b'\r' => Delay::Quote,
                b'"' => {
                    self.millis = 0;
                    self.fraction = None;
                    Delay::Digits
                }
                _ => Delay::Key,
            },
            Delay::Digits => match (byte, self.fraction) {
                (b'0'..=b'9', None) => {
                    let digit = u64::from(byte - b'0');
                    self.millis = self.millis.saturating_mul(10).saturating_add(digit * 1_000);
                    Delay::Digits
                }
                (b'0'..=b'9', Some(scale)) => {
                    // Past milliseconds, further digits are dropped.
                    if scale > 1 {
                        let scale = scale / 10;
                        self.millis += u64::from(byte - b'0') * scale;
                        self.fraction = Some(scale);
                    }
                    Delay::Digits
                }
                (b'.', None) => {
                    self.fraction = Some(1_000);
                    Delay::Digits
                }
                (b's', _) => Delay::Unit,
                _ => Delay::Key,
            },
            Delay::Unit => {
                if byte == b'"' {
                    self.found = Some(Duration::from_millis(self.millis));
                }
                Delay::Key
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `stream` holds an error event, fed whole and cut at every
    /// place into two pieces, and byte by byte: the answer must not change.
    fn sse_error(stream: &str) -> bool {
        let bytes = stream.as_bytes();
        let whole = SseScan::default().feed(bytes);
        for cut in 0..=bytes.len() {
            let mut scan = SseScan::default();
            let found = scan.feed(&bytes[..cut]) | scan.feed(&bytes[cut..]);
            assert_eq!(found, whole, "cut at {cut} of {stream:?}");
        }
        let mut scan = SseScan::default();
        let by_byte = bytes.iter().fold(false, |f, b| scan.feed(&[*b]) | f);
        assert_eq!(by_byte, whole, "byte by byte: {stream:?}");
        whole
    }

    #[test]
    fn an_anthropic_error_event_is_an_error_however_it_is_cut() {
        assert!(sse_error(
            "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n"
        ));
        assert!(sse_error("event:error\r\n\r\n"));
        assert!(sse_error("event: error\r"));
    }

    #[test]
    fn a_data_line_with_a_top_level_error_is_an_error_however_it_is_cut() {
        assert!(sse_error(
            "data: {\"error\": {\"message\": \"The server had an error\", \"type\": \"server_error\"}}\n\n"
        ));
        assert!(sse_error("data:{\"id\":1,\"error\":\"boom\"}\n"));
        // An event's data lines are one JSON text.
        assert!(sse_error("data: {\"id\": 1,\ndata: \"error\": {}}\n\n"));
    }

    #[test]
    fn ordinary_chunks_are_no_error() {
        let chunk = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"error\"},\"finish_reason\":null}]}\n\n";
        assert!(!sse_error(chunk));
        assert!(!sse_error("data: [DONE]\n\n"));
        assert!(!sse_error(
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
        ));
        // Nested errors, errors in values, null errors, other fields.
        assert!(!sse_error(
            "data: {\"choices\":[{\"error\":{}}],\"x\":{\"error\":1}}\n"
        ));
        assert!(!sse_error("data: {\"message\":\"error\"}\n"));
        assert!(!sse_error("data: {\"error\": null, \"ok\": true}\n"));
        assert!(!sse_error("data: {\"error\":false}\n"));
        assert!(!sse_error("data: {\"err\\u006fr\": 1}\n"));
        assert!(!sse_error(
            "event: errors\nevent: my error\n: event: error\nid: error\n\n"
        ));
        assert!(!sse_error("retry: 1000\ndata\n\n"));
    }

    #[test]
    fn an_event_ends_its_json_at_the_blank_line() {
        // The first event's JSON never closes; the next event starts afresh.
        assert!(sse_error("data: {\"a\": [\n\ndata: {\"error\": 1}\n\n"));
        assert!(!sse_error("data: {\"a\": \"\n\ndata: error\"}\n\n"));
    }

    #[test]
    fn deep_nesting_and_long_names_do_not_overflow() {
        let deep = format!("data: {}{}\n", "[".repeat(70_000), "]".repeat(70_000));
        assert!(!SseScan::default().feed(deep.as_bytes()));
        let long = format!("{}: error\n", "e".repeat(300));
        assert!(!SseScan::default().feed(long.as_bytes()));
    }

    fn retry_delay(body: &str) -> Option<Duration> {
        let bytes = body.as_bytes();
        let whole = {
            let mut scan = RetryDelayScan::default();
            scan.feed(bytes);
            scan.delay()
        };
        for cut in 0..=bytes.len() {
            let mut scan = RetryDelayScan::default();
            scan.feed(&bytes[..cut]);
            scan.feed(&bytes[cut..]);
            assert_eq!(scan.delay(), whole, "cut at {cut} of {body:?}");
        }
        whole
    }

    #[test]
    fn geminis_retry_delay_is_read_however_the_body_is_cut() {
        let body = r#"{"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "52s"}]}}"#;
        assert_eq!(retry_delay(body), Some(Duration::from_secs(52)));
        assert_eq!(
            retry_delay(r#"{"retryDelay":"1.5s"}"#),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(
            retry_delay(r#"{"retryDelay" : "0.0015s"}"#),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            retry_delay(r#"{"""retryDelay": "7s"}"#),
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn malformed_retry_delays_give_nothing() {
        for body in [
            r#"{"retryDelay": 52}"#,
            r#"{"retryDelay": "52"}"#,
            r#"{"retryDelay": "-5s"}"#,
            r#"{"retryDelay": "5ms"}"#,
            r#"{"retryDelays": "5s"}"#,
            r#"{"retryDelay": "5s"#,
            "",
        ] {
            assert_eq!(retry_delay(body), None, "{body}");
        }
        let huge = format!(r#"{{"retryDelay": "{}s"}}"#, "9".repeat(40));
        assert_eq!(retry_delay(&huge), Some(Duration::from_millis(u64::MAX)));
    }
}
