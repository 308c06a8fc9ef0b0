//! What a proxy follows of the bytes it passes: ZooKeeper's length-prefixed
//! frames and HTTP/2's frames that end a request.

/// Splits ZooKeeper's length-prefixed frames off a byte stream; the first
/// frame each way is the connect handshake, which has no xid.
#[derive(Default)]
pub(super) struct Frames {
    buffer: Vec<u8>,
    /// How many frames were taken off (the first is the handshake).
    pub(super) seen: usize,
}

impl Frames {
    /// Appends bytes; returns the complete frames (length prefix included).
    pub(super) fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buffer.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while self.buffer.len() >= 4 {
            let len = i32::from_be_bytes([self.buffer[0], self.buffer[1], self.buffer[2], self.buffer[3]]);
            let total = 4 + usize::try_from(len).unwrap_or(0);
            if self.buffer.len() < total {
                break;
            }
            frames.push(self.buffer.drain(..total).collect());
        }
        frames
    }
}

/// Follows HTTP/2 framing on a connection's request side, counting the
/// frames that end a stream (a whole request). A connection that does not
/// open with HTTP/2's preface is not followed.
#[derive(Default)]
pub(super) struct H2Ends {
    /// The bytes of the preface, or of a frame, read so far.
    buffer: Vec<u8>,
    /// Past the preface (`Some(true)`), not HTTP/2 (`Some(false)`), or not
    /// known yet.
    h2: Option<bool>,
}

impl H2Ends {
    const PREFACE: &'static [u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const DATA: u8 = 0;
    const HEADERS: u8 = 1;
    const END_STREAM: u8 = 1;

    /// Reads the next bytes; returns how many streams they ended.
    pub(super) fn push(&mut self, bytes: &[u8]) -> usize {
        if self.h2 == Some(false) {
            return 0;
        }
        self.buffer.extend_from_slice(bytes);
        if self.h2.is_none() {
            let n = self.buffer.len().min(Self::PREFACE.len());
            if self.buffer[..n] != Self::PREFACE[..n] {
                self.h2 = Some(false);
                self.buffer = Vec::new();
                return 0;
            }
            if n < Self::PREFACE.len() {
                return 0;
            }
            self.buffer.drain(..n);
            self.h2 = Some(true);
        }
        let mut ends = 0;
        while self.buffer.len() >= 9 {
            let len =
                usize::from(self.buffer[0]) << 16 | usize::from(self.buffer[1]) << 8 | usize::from(self.buffer[2]);
            if self.buffer.len() < 9 + len {
                break;
            }
            let (kind, flags) = (self.buffer[3], self.buffer[4]);
            if matches!(kind, Self::DATA | Self::HEADERS) && flags & Self::END_STREAM != 0 {
                ends += 1;
            }
            self.buffer.drain(..9 + len);
        }
        ends
    }
}

pub(super) fn be_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let b = bytes.get(at..at + 4)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::H2Ends;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut bytes = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, 1];
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn a_request_counts_once_its_last_frame_is_whole() {
        let mut bytes = H2Ends::PREFACE.to_vec();
        bytes.extend(frame(4, 0, &[0; 6])); // SETTINGS
        bytes.extend(frame(1, 4, &[7; 20])); // HEADERS, END_HEADERS
        bytes.extend(frame(0, 0, &[1; 10])); // DATA, more to come
        bytes.extend(frame(6, 0, &[0; 8])); // PING
        let last = frame(0, 1, &[2; 30]); // DATA, END_STREAM
        let mut h2 = H2Ends::default();
        // Byte by byte: nothing ends before the last frame is whole.
        assert_eq!(bytes.iter().map(|b| h2.push(&[*b])).sum::<usize>(), 0);
        assert_eq!(h2.push(&last[..20]), 0);
        assert_eq!(h2.push(&last[20..]), 1);
        assert_eq!(h2.push(&frame(1, 5, &[])), 1, "HEADERS that end the stream");
    }

    #[test]
    fn a_connection_without_the_preface_is_not_followed() {
        let mut h2 = H2Ends::default();
        assert_eq!(h2.push(b"*2\r\n$3\r\nGET"), 0);
        let mut end = vec![0, 0, 0, 0, 1, 0, 0, 0, 1];
        end.extend_from_slice(b"PRI");
        assert_eq!(h2.push(&end), 0);
    }
}
