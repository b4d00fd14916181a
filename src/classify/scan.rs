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
    pub(crate) fn feed(&mut self, piece: &[u8]) -> bool {
        piece.iter().any(|&byte| self.byte(byte))
    }

    fn byte(&mut self, byte: u8) -> bool {
        let after_cr = std::mem::take(&mut self.after_cr);
        match byte {
            b'\n' if after_cr => false,
            b'\r' | b'\n' => {
                self.after_cr = byte == b'\r';
                self.end_line()
            }
            _ => self.in_line(byte),
        }
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

impl Json {
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
                false
            }
        }
    }
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
