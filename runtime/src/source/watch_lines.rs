//! A watch response body split into its event lines as the body's frames arrive, with a cap
//! on the length of one line.
//!
//! The API server writes one JSON event per line. Frames do not follow lines: a line may
//! arrive in one frame, or cut across any number of them. Lines are handed on where they lie
//! in a frame; only the start of a line cut by the end of a frame is copied, to be joined with
//! its rest.
//!
//! Invariants:
//! - Every byte of the body belongs to exactly one line (the `\n` ending it excluded), handed
//!   on in order; bytes after the last `\n` are the stream's [`rest`](WatchLines::rest).
//! - No line longer than the cap is handed on, and the bytes kept between frames never exceed
//!   the cap: a line that grows past it is refused as soon as it does (whether or not its end
//!   has arrived), so a server that never ends a line cannot make the host buffer without
//!   bound.
//! - Nothing here can panic on any input.

/// Why a watch body could not be split.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchLinesError<E> {
    /// A line is longer than the cap (`len` is how much of it had arrived when refused).
    #[error("a watch event of at least {len} bytes is over the limit of {limit} bytes")]
    TooLong { len: usize, limit: usize },
    /// The line consumer refused a line.
    #[error(transparent)]
    Line(E),
}

/// Splits a watch body fed frame by frame ([`push`](Self::push)) into lines.
#[derive(Debug)]
pub struct WatchLines {
    /// The start of a line cut by the end of a frame.
    partial: Vec<u8>,
    max_line: usize,
}

impl WatchLines {
    /// A splitter refusing lines longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        Self { partial: Vec::new(), max_line }
    }

    /// Feeds the next frame; calls `line` with each line it completes, in order. Stops at the
    /// first error (a line too long, or one `line` refused); the splitter is not to be fed
    /// after an error.
    pub fn push<E>(
        &mut self,
        frame: &[u8],
        mut line: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), WatchLinesError<E>> {
        let mut rest = frame;
        if !self.partial.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.keep(rest)?;
                return Ok(());
            };
            self.keep(&rest[..nl])?;
            rest = &rest[nl + 1..];
            let joined = std::mem::take(&mut self.partial);
            line(&joined).map_err(WatchLinesError::Line)?;
            // The allocation is kept for the next cut line.
            self.partial = joined;
            self.partial.clear();
        }
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            let complete = &rest[..nl];
            if complete.len() > self.max_line {
                return Err(WatchLinesError::TooLong { len: complete.len(), limit: self.max_line });
            }
            line(complete).map_err(WatchLinesError::Line)?;
            rest = &rest[nl + 1..];
        }
        self.keep(rest)
    }

    /// The bytes after the last newline (a last line the server did not end, or the start of
    /// one the stream was cut inside).
    pub fn rest(&self) -> &[u8] {
        &self.partial
    }

    /// Appends to the cut line, refusing to grow it past the cap.
    fn keep<E>(&mut self, bytes: &[u8]) -> Result<(), WatchLinesError<E>> {
        let len = self.partial.len().saturating_add(bytes.len());
        if len > self.max_line {
            // Nothing of an over-long line is kept.
            self.partial = Vec::new();
            return Err(WatchLinesError::TooLong { len, limit: self.max_line });
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The lines of a body, and its rest.
    type Split = (Vec<Vec<u8>>, Vec<u8>);

    /// Feeds `frames`; the lines, the rest, or the error.
    fn split(frames: &[&[u8]], max: usize) -> Result<Split, WatchLinesError<()>> {
        let mut s = WatchLines::new(max);
        let mut lines = Vec::new();
        for frame in frames {
            s.push(frame, |l| {
                lines.push(l.to_vec());
                Ok::<(), ()>(())
            })?;
        }
        Ok((lines, s.rest().to_vec()))
    }

    #[test]
    fn lines_are_joined_across_frames() {
        let (lines, rest) = split(&[b"{\"a\"", b":1}\n{\"b\":2}\n{", b"\"c\":", b"3}\n{\"d"], 100).unwrap();
        assert_eq!(lines, [&br#"{"a":1}"#[..], br#"{"b":2}"#, br#"{"c":3}"#]);
        assert_eq!(rest, br#"{"d"#);
    }

    #[test]
    fn a_line_at_the_cap_passes_and_one_byte_more_is_refused() {
        let (lines, _) = split(&[b"0123", b"4567\n"], 8).unwrap();
        assert_eq!(lines, [b"01234567"]);
        assert_eq!(split(&[b"012345678\n"], 8), Err(WatchLinesError::TooLong { len: 9, limit: 8 }));
        assert_eq!(split(&[b"0123", b"45678\n"], 8), Err(WatchLinesError::TooLong { len: 9, limit: 8 }));
    }

    #[test]
    fn a_line_that_never_ends_is_refused_once_past_the_cap() {
        let mut s = WatchLines::new(1000);
        let frame = [b'x'; 300];
        let mut refused = None;
        for n in 1..=10 {
            match s.push(&frame, |_| Err::<(), ()>(())) {
                Ok(()) => assert!(s.rest().len() <= 1000, "kept bytes stay under the cap"),
                Err(e) => {
                    refused = Some((n, e));
                    break;
                }
            }
        }
        assert_eq!(refused, Some((4, WatchLinesError::TooLong { len: 1200, limit: 1000 })));
        assert!(s.rest().is_empty(), "nothing of the refused line is kept");
    }

    #[test]
    fn a_refused_line_stops_the_split() {
        let mut s = WatchLines::new(100);
        let mut seen = Vec::new();
        let r = s.push(b"a\nstop\nc\n", |l| {
            seen.push(l.to_vec());
            if l == b"stop" { Err("stop") } else { Ok(()) }
        });
        assert_eq!(r, Err(WatchLinesError::Line("stop")));
        assert_eq!(seen, [b"a".to_vec(), b"stop".to_vec()]);
    }

    proptest! {
        /// However a body is cut into frames, the lines are the body's `\n`-separated parts.
        #[test]
        fn frames_do_not_change_the_lines(
            body in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), any::<u8>()], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort();
            let mut frames = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([body.len()]) {
                frames.push(&body[at..c]);
                at = c;
            }
            let (lines, rest) = split(&frames, usize::MAX).unwrap();
            let mut want: Vec<Vec<u8>> = body.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
            let want_rest = want.pop().unwrap_or_default();
            prop_assert_eq!(lines, want);
            prop_assert_eq!(rest, want_rest);
        }
    }
}
