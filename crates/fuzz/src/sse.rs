//! Server-sent events from an upstream: the splitter that finds whole
//! events in a byte stream however it is framed, and reading and replacing
//! an event's data for the response-chunk hooks.

use bolero::TypeGenerator;
use sluice_gateway::fuzzing::{EventSplitter, data_event, data_of, with_data};

use crate::pick;

/// A stream, the frames it arrives in, and data a plugin writes back.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Stream {
    #[generator(bolero::produce::<Vec<Piece>>().with().len(0..64usize))]
    pub pieces: Vec<Piece>,
    /// Frame sizes, in turn (0 is an empty frame); none: one frame.
    #[generator(bolero::produce::<Vec<u8>>().with().len(0..16usize))]
    pub frames: Vec<u8>,
    #[generator(bolero::produce::<Vec<Piece>>().with().len(0..6usize))]
    pub new_data: Vec<Piece>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Piece {
    Known(u8),
    Text(#[generator(bolero::produce::<String>().with().len(0..8usize))] String),
    Byte(u8),
}

/// Field names, line ends and payloads an event stream is made of.
const PIECES: &[&str] = &[
    "data: ",
    "data:",
    "data",
    "event: delta",
    "id: 7",
    ": keep-alive",
    "retry: 10",
    "datax: 1",
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    "\r\n\r\n",
    " ",
    "{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
    "[DONE]",
];

fn render(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Known(i) => out.extend_from_slice(pick(PIECES, *i).as_bytes()),
            Piece::Text(s) => out.extend_from_slice(s.as_bytes()),
            Piece::Byte(b) => out.push(*b),
        }
    }
    out
}

/// The events of `frames`, pushed one by one and drained after each push as
/// the relay does, then the remainder; checks `buffered()` on the way.
pub fn split<'a>(frames: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let mut splitter = EventSplitter::default();
    let mut events = Vec::new();
    let (mut pushed, mut taken) = (0, 0);
    for frame in frames {
        splitter.push(frame);
        pushed += frame.len();
        assert_eq!(splitter.buffered(), pushed - taken, "buffered after a push");
        while let Some(event) = splitter.next_event() {
            taken += event.len();
            events.push(event.to_vec());
        }
        assert_eq!(splitter.buffered(), pushed - taken, "buffered after draining");
    }
    let remainder = splitter.remainder().map(|b| b.to_vec());
    assert_eq!(splitter.buffered(), 0, "the remainder takes everything");
    (events, remainder)
}

/// The end of the first event terminator (`\n\n` or `\n\r\n`), if any.
fn first_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        if bytes[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else if bytes[i..].starts_with(b"\n\r\n") {
            Some(i + 3)
        } else {
            None
        }
    })
}

pub fn check(stream: &Stream) {
    let bytes = render(&stream.pieces);
    let whole = split([bytes.as_slice()]);

    // However the stream is framed, the same events come out.
    let mut frames = Vec::new();
    let mut rest = bytes.as_slice();
    let sizes: Vec<usize> = stream.frames.iter().map(|&n| usize::from(n % 40)).collect();
    if sizes.iter().any(|&n| n > 0) {
        for &n in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (frame, tail) = rest.split_at(n.min(rest.len()));
            frames.push(frame);
            rest = tail;
        }
    } else {
        frames.push(rest);
    }
    assert_eq!(split(frames), whole, "framing changed the events");

    // The events are the stream, cut right after each first terminator;
    // only a blank tail is dropped.
    let (events, remainder) = whole;
    let mut offset = 0;
    for event in &events {
        assert_eq!(first_end(event), Some(event.len()), "an event must end at its first blank line: {event:?}");
        assert_eq!(&bytes[offset..offset + event.len()], event.as_slice());
        offset += event.len();
    }
    let tail = &bytes[offset..];
    assert_eq!(first_end(tail), None, "a whole event was left behind");
    match &remainder {
        Some(remainder) => assert_eq!(remainder.as_slice(), tail),
        None => assert!(tail.iter().all(u8::is_ascii_whitespace), "a non-blank tail was dropped: {tail:?}"),
    }

    // What a plugin writes back is what a reader of the event gets.
    let new_data = String::from_utf8_lossy(&render(&stream.new_data)).into_owned();
    for event in events.iter().chain(&remainder) {
        let _ = data_of(event);
        let rewritten = with_data(event, &new_data);
        assert!(rewritten.ends_with(b"\n\n"), "a rewritten event ends with a blank line: {rewritten:?}");
        // `\r` ends a line for SSE readers but not here: only data without
        // it comes back as written.
        if !new_data.contains('\r') {
            assert_eq!(data_of(&rewritten).as_deref(), Some(new_data.as_str()), "{rewritten:?}");
        }
    }
    if !new_data.contains('\r') {
        let event = data_event(&new_data);
        assert_eq!(data_of(event.as_bytes()).as_deref(), Some(new_data.as_str()), "{event:?}");
        assert_eq!(first_end(event.as_bytes()), Some(event.len()), "data_event is one event: {event:?}");
    }
}
