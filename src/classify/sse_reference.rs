//! The SSE scanner as first written, a byte at a time: the reference the
//! word-at-a-time [`SseScan`](crate::classify::scan::SseScan) is checked against,
//! every stream cut every way. Test builds only.

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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::SseScan as Reference;
    use crate::classify::scan::SseScan as Scan;

    /// Feeds `pieces` to the scanner and to the reference, in order: they
    /// must answer alike piece by piece, up to the first error (after it
    /// the body stops asking).
    fn agree(stream: &[u8], cuts: &[usize]) {
        let mut scan = Scan::default();
        let mut reference = Reference::default();
        let mut from = 0;
        for &to in cuts.iter().chain([&stream.len()]) {
            let piece = &stream[from..to];
            let expected = reference.feed(piece);
            assert_eq!(
                scan.feed(piece),
                expected,
                "piece {from}..{to} of {:?}, cut at {cuts:?}",
                String::from_utf8_lossy(stream)
            );
            if expected {
                return;
            }
            from = to;
        }
    }

    /// Streams a provider sends, and the corners of the format.
    const SAMPLES: &[&str] = &[
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\"an \\\"error\\\": {}\"}}]}\n\ndata: [DONE]\n\n",
        "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n",
        "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent:error\r\n\r\n",
        "data: {\"error\": {\"message\": \"The server had an error\", \"type\": \"server_error\"}}\n\n",
        "data:{\"id\":1,\"error\":\"boom\"}\n",
        "data: {\"id\": 1,\ndata: \"error\": {}}\n\n",
        "data: {\"choices\":[{\"error\":{}}],\"x\":{\"error\":1}}\n",
        "data: {\"message\":\"error\"}\r\ndata: {\"error\": null, \"ok\": true}\r\n\r\n",
        "data: {\"error\":false}\n\ndata: {\"err\\u006fr\": 1}\n\ndata: {\"a\":1}{\"error\":1}\n\n",
        "event: errors\nevent: my error\n: event: error\nid: error\n\nretry: 1000\ndata\n\n",
        "data: {\"a\": [\n\ndata: {\"error\": 1}\n\n",
        "data: {\"a\": \"\n\ndata: error\"}\n\n",
        "data: {\"a\": \"\\\\\", \"error\": true}\r\rdata:  {\"error\": 1}\r",
        ": keep-alive\r\n\r\ndata: {\"x\": \"\\\"error\\\"\", \"y\": [\"error\"], \"error\"\r\n: ping\r\ndata: : 0}\r\n\r\n",
        "data: {\"e\": 1, \"er\": 2, \"errorr\": 3, \"error\" : \t\"yes\"}\n\n",
        "data: {\"x\": {\"a\": \"}\", \"b\": \"]\"}, \"error\": {}}\n\ndata: {\"x\": \"{\", \"error\": [1]}\n\n",
        "data: \"error\"\n\ndata: [{\"error\": 1}]\n\ndata:{\"error\":n}\ndata:\n\nevent: error",
    ];

    #[test]
    fn the_scanner_agrees_with_the_reference_at_every_cut() {
        for sample in SAMPLES {
            let stream = sample.as_bytes();
            for cut in 0..=stream.len() {
                agree(stream, &[cut]);
                for second in cut..=stream.len() {
                    agree(stream, &[cut, second]);
                }
            }
            let by_byte: Vec<usize> = (1..stream.len()).collect();
            agree(stream, &by_byte);
        }
    }

    /// The pieces random streams are made of: lines, their starts and
    /// ends, and the bytes of JSON that move the scanners.
    const PARTS: &[&str] = &[
        "data: ",
        "data:",
        "event: ",
        "event:",
        "error",
        "err",
        "or",
        ": ",
        "\n",
        "\r",
        "\r\n",
        "\n\n",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        "\\\"",
        ":",
        ",",
        " ",
        "\t",
        "null",
        "false",
        "true",
        "1",
        "n",
        "f",
        "x",
        "id",
        "\"error\"",
        "\"error\":",
        "{\"error\":",
        "\"id\":\"chatcmpl-1\",",
        "\"content\":\"Hello, the error\"",
        "longer text without any special byte in it ",
    ];

    proptest! {
        #[test]
        fn the_scanner_agrees_with_the_reference_on_random_streams(
            parts in prop::collection::vec(0..PARTS.len(), 0..48),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let stream: Vec<u8> = parts.iter().flat_map(|&p| PARTS[p].bytes()).collect();
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            cuts.sort_unstable();
            agree(&stream, &cuts);
        }
    }
}
