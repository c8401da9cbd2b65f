//! Sealed frames: after the handshake every frame of a connection is encrypted and
//! authenticated under keys only its two ends know, and each is taken at most once.
//!
//! - **Keys.** Each end brings an ephemeral X25519 key to the handshake; both sign the
//!   transcript with their node keys (see `conn/handshake.rs`). HKDF-SHA256 over the
//!   Diffie-Hellman secret, salted with the fabric secret and bound to the transcript, gives
//!   one AEAD key per direction. Someone who holds the fabric secret but is not one of the
//!   two nodes can neither read nor forge frames; a recorded connection stays unreadable.
//! - **The cipher: AEGIS-128X2, and why encrypt.** Sealing runs on the core that also moves
//!   the frames, so its cost per byte adds to the transport's. AEGIS-128X2 (the two-lane
//!   AEGIS-128L of the CFRG's AEGIS draft; the `aegis` crate, by libsodium's author, picks
//!   the AES-NI or VAES code at run time) is built from AES rounds alone, with no
//!   multiplication: measured here on a 1.5 KB frame, 12.7 GB/s against ring's AES-128-GCM
//!   5.0 GB/s (8.9 KB: 23.9 against 6.6), and at 64 B 70 ns against 95. MAC-only choices
//!   run no faster than it authenticates and encrypts (AEGIS-128L's MAC 9.3 GB/s at 1.5 KB;
//!   GMAC ≈ 1.8, Poly1305 ≈ 1.8, HMAC-SHA256 ≈ 1.3, keyed BLAKE3 ≈ 0.8), so
//!   confidentiality costs nothing extra. Like AES-GCM it needs a nonce never repeated
//!   under a key (below), and gives 128-bit security with a 16-byte tag.
//! - **The trailer.** A sealed frame is the header (flag [`rackwire_wire::FLAG_SEALED`],
//!   checksums over the plaintext), the encrypted payload, then a 64-bit counter and the
//!   16-byte tag. The counter is the AEAD nonce (its last eight bytes, the rest zero): it
//!   counts every frame sent in that direction (a retransmission is a new frame with a new
//!   counter), so no nonce repeats under a key. The header and the counter are authenticated
//!   with the payload.
//! - **Replays.** The receiver remembers which counters it took within the last
//!   [`REPLAY_WINDOW`] (a sliding bitmap, as in IPsec and WireGuard) and refuses a counter
//!   taken before or older than that; a connection never has more than
//!   [`crate::WINDOW_FRAMES_MAX`] frames in flight, half the window, so reordering across links
//!   never looks like a replay.

use aegis::aegis128x2::Aegis128X2;
use rackwire_wire::kx::Ephemeral;
use rackwire_wire::{Frame, HEADER_LEN};

/// Bytes after a sealed frame's payload: the counter, then the tag.
pub const TRAILER_LEN: usize = COUNTER_LEN + TAG_LEN;
const _: () = assert!(TRAILER_LEN == rackwire_wire::SEALED_TRAILER_LEN);
const COUNTER_LEN: usize = 8;
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 16;
/// Up to this many payload bytes, a frame is sealed or opened in one call on a copy of its
/// payload (a memory copy of a few KiB costs less than wiping the incremental cipher state,
/// which goes a byte at a time); larger ones are processed from where they lie.
const ONE_PASS_COPY_MAX: usize = 16 * 1024;
const NONCE_LEN: usize = 16;
/// Counters remembered behind the highest taken.
pub const REPLAY_WINDOW: u64 = 8192;
const WORDS: usize = (REPLAY_WINDOW / 64) as usize;
const _: () = assert!(REPLAY_WINDOW >= 2 * crate::WINDOW_FRAMES_MAX as u64);

/// The two directions' keys from the handshake's ephemeral keys: the Diffie-Hellman secret
/// with the peer's `their_public`, through HKDF salted with `secret` (the fabric's) and bound
/// to `transcript`. `None` if the key was used already or the peer's key is not a valid X25519
/// point.
pub(crate) fn keys(
    eph: &mut Ephemeral,
    their_public: &[u8; 32],
    secret: &[u8],
    transcript: &[u8],
    initiator: bool,
) -> Option<Keys> {
    let mut okm = [0u8; 32];
    if !eph.agree(their_public, secret, &[b"rackwire-edge-frame-keys", transcript], &mut okm) {
        return None;
    }
    let (i_to_a, a_to_i) = okm.split_at(16);
    let (tx, rx) = if initiator { (i_to_a, a_to_i) } else { (a_to_i, i_to_a) };
    let key = |k: &[u8]| <[u8; KEY_LEN]>::try_from(k).expect("16 bytes of the 32");
    Some(Keys { tx: key(tx), rx: key(rx), next: 0, window: ReplayWindow::default() })
}

/// Why a sealed frame was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsealed {
    /// Not a sealed frame's shape (length, trailer).
    Malformed,
    /// Its tag does not hold: damaged, forged, or sealed under other keys.
    Forged,
    /// Its counter was taken before, or is too old to tell.
    Replayed,
}

/// One connection's frame keys, its send counter and what it took.
pub(crate) struct Keys {
    tx: [u8; KEY_LEN],
    rx: [u8; KEY_LEN],
    next: u64,
    window: ReplayWindow,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("next", &self.next).field("window", &self.window.top).finish()
    }
}

fn nonce(counter: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[NONCE_LEN - COUNTER_LEN..].copy_from_slice(&counter.to_be_bytes());
    n
}

fn aad(header: &[u8], counter: u64) -> [u8; HEADER_LEN + COUNTER_LEN] {
    let mut a = [0u8; HEADER_LEN + COUNTER_LEN];
    a[..HEADER_LEN].copy_from_slice(&header[..HEADER_LEN]);
    a[HEADER_LEN..].copy_from_slice(&counter.to_be_bytes());
    a
}

impl Keys {
    /// Seal the frame in `buf[..len]` (header and plaintext payload, checksums filled), with
    /// room for [`TRAILER_LEN`] more bytes after it; returns the sealed frame's length.
    pub(crate) fn seal(&mut self, buf: &mut [u8], len: usize) -> usize {
        self.seal_with(buf, len, &[])
    }

    /// [`Keys::seal`] for a frame whose payload ends with `body`, which is not in `buf` yet:
    /// `buf[..head_len]` holds the header and the payload's first bytes, and `body` is
    /// encrypted from where it lies straight into `buf` behind them (one pass over it instead
    /// of a copy and then another). `buf` has room for the body and [`TRAILER_LEN`] more.
    pub(crate) fn seal_with(&mut self, buf: &mut [u8], head_len: usize, body: &[u8]) -> usize {
        let len = head_len + body.len();
        debug_assert!(head_len >= HEADER_LEN && buf.len() >= len + TRAILER_LEN);
        Frame::new_unchecked(&mut buf[..HEADER_LEN]).set_sealed();
        let counter = self.next;
        self.next += 1;
        let a = aad(buf, counter);
        let cipher = Aegis128X2::<TAG_LEN>::new(&self.tx, &nonce(counter));
        let tag = if body.len() <= ONE_PASS_COPY_MAX {
            // Small frames (most): the body is copied behind the head and the payload sealed
            // in one call, which keeps its state on the stack (the incremental state is wiped
            // byte by byte when dropped, which costs more than copying this much).
            buf[head_len..len].copy_from_slice(body);
            cipher.encrypt_in_place(&mut buf[HEADER_LEN..len], &a)
        } else {
            let mut enc = cipher.encryptor(&a);
            let (head, rest) = buf.split_at_mut(head_len);
            enc.update_in_place(&mut head[HEADER_LEN..]);
            enc.update(body, &mut rest[..body.len()]);
            enc.finalize()
        };
        buf[len..len + COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
        buf[len + COUNTER_LEN..len + TRAILER_LEN].copy_from_slice(tag.as_ref());
        len + TRAILER_LEN
    }

    /// Open the sealed frame `bytes` into `out` (header and plaintext payload, no trailer),
    /// taking its counter; returns the opened frame's length (`out` keeps its length from
    /// frame to frame, so refilling it costs nothing: the frame is `out[..n]`). The payload is
    /// decrypted from `bytes` straight into `out`, one pass. Nothing is kept of a frame that
    /// fails (`out` is cleared).
    pub(crate) fn open(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<usize, Unsealed> {
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(Unsealed::Malformed);
        }
        let len = HEADER_LEN + Frame::new_unchecked(bytes).payload_len() as usize;
        if bytes.len() != len + TRAILER_LEN {
            return Err(Unsealed::Malformed);
        }
        let mut c = [0u8; COUNTER_LEN];
        c.copy_from_slice(&bytes[len..len + COUNTER_LEN]);
        let counter = u64::from_be_bytes(c);
        if !self.window.fresh(counter) {
            return Err(Unsealed::Replayed);
        }
        let a = aad(bytes, counter);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&bytes[len + COUNTER_LEN..]);
        if out.len() < len {
            out.resize(len, 0);
        }
        out[..HEADER_LEN].copy_from_slice(&bytes[..HEADER_LEN]);
        let cipher = Aegis128X2::<TAG_LEN>::new(&self.rx, &nonce(counter));
        let opened = if len - HEADER_LEN <= ONE_PASS_COPY_MAX {
            // As in `seal_with`: a copy and one call beat the incremental state's wipe.
            out[HEADER_LEN..len].copy_from_slice(&bytes[HEADER_LEN..len]);
            cipher.decrypt_in_place(&mut out[HEADER_LEN..len], &tag, &a).map(|_| ())
        } else {
            let mut dec = cipher.decryptor(&a, &mut out[HEADER_LEN..len]);
            dec.update(&bytes[HEADER_LEN..len]).and_then(|()| dec.finalize(&tag).map(|_| ()))
        };
        match opened {
            Ok(()) => {
                self.window.take(counter);
                Ok(len)
            }
            Err(_) => {
                out.clear();
                Err(Unsealed::Forged)
            }
        }
    }
}

/// Which of the last [`REPLAY_WINDOW`] counters were taken.
#[derive(Clone, Debug)]
struct ReplayWindow {
    /// One past the highest counter taken (0: none yet).
    top: u64,
    /// Bit `c % REPLAY_WINDOW` is set when counter `c` (within the window) was taken.
    bits: Box<[u64; WORDS]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { top: 0, bits: Box::new([0; WORDS]) }
    }
}

impl ReplayWindow {
    fn bit(c: u64) -> (usize, u64) {
        let i = c % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `c` may be taken: newer than all, or within the window and not taken.
    fn fresh(&self, c: u64) -> bool {
        if c >= self.top {
            return true;
        }
        if self.top - c > REPLAY_WINDOW {
            return false;
        }
        let (w, b) = Self::bit(c);
        self.bits[w] & b == 0
    }

    /// Take `c` (checked with [`ReplayWindow::fresh`]).
    fn take(&mut self, c: u64) {
        if c >= self.top {
            // Clear the bits of the counters the window slides past (those in top..=c, whose
            // slots held counters a window older).
            let from = self.top.max((c + 1).saturating_sub(REPLAY_WINDOW));
            if c + 1 - from >= REPLAY_WINDOW {
                self.bits.fill(0);
            } else {
                for k in from..=c {
                    let (w, b) = Self::bit(k);
                    self.bits[w] &= !b;
                }
            }
            self.top = c + 1;
        }
        let (w, b) = Self::bit(c);
        self.bits[w] |= b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Keys, Keys) {
        let mut a = Ephemeral::generate();
        let mut b = Ephemeral::generate();
        let (pa, pb) = (a.public, b.public);
        (keys(&mut a, &pb, b"secret", b"t", true).unwrap(), keys(&mut b, &pa, b"secret", b"t", false).unwrap())
    }

    fn frame(payload: &[u8]) -> Vec<u8> {
        let repr = rackwire_wire::FrameRepr {
            kind: rackwire_wire::FrameKind::Data,
            link: 0,
            conn: 7,
            seq: 1,
            ack: None,
            ts: 0,
            payload_len: payload.len() as u16,
        };
        let mut buf = vec![0u8; repr.buffer_len() + TRAILER_LEN];
        let mut f = repr.emit(&mut buf);
        f.payload_mut().copy_from_slice(payload);
        f.fill_checksums();
        buf
    }

    // Checks a sealed frame opens at the other end to the same header (now flagged sealed)
    // and payload, its payload is not readable on the wire, and the reverse direction works
    // with the other key.
    #[test]
    fn sealed_frames_open_at_the_peer_only() {
        let (mut a, mut b) = pair();
        let mut buf = frame(b"hello, sealed world");
        let plain_len = buf.len() - TRAILER_LEN;
        let n = a.seal(&mut buf, plain_len);
        assert_eq!(n, buf.len());
        assert!(!buf.windows(5).any(|w| w == b"hello"), "the payload is encrypted");
        let mut out = Vec::new();
        b.open(&buf, &mut out).unwrap();
        let f = Frame::new_checked(&out[..]).expect("the opened frame passes every check");
        assert!(f.sealed());
        assert_eq!(f.payload(), b"hello, sealed world");
        // a's own receive key is the other direction's: its own frame does not open there.
        assert_eq!(a.open(&buf, &mut out), Err(Unsealed::Forged));
        let mut back = frame(b"reply");
        let l = back.len() - TRAILER_LEN;
        b.seal(&mut back, l);
        a.open(&back, &mut out).unwrap();
    }

    // Checks sealing a frame whose body lies elsewhere (`seal_with`): for payloads of 0 to
    // 40000 bytes split at several points between the part in the buffer and the body, the
    // frame sealed that way is byte for byte the frame sealed whole in the buffer (two key
    // sets made equal by taking them from the same handshake), and it opens at the peer to
    // the whole payload, in an output buffer reused across frames of shrinking and growing
    // sizes (the opened length is the frame's, whatever the buffer's). Sizes on both sides of
    // `ONE_PASS_COPY_MAX` make the one-call and the incremental ways meet: a body sealed
    // incrementally is the frame sealed in one call, and both open either way.
    #[test]
    fn a_body_sealed_from_where_it_lies_is_the_frame_sealed_whole() {
        let mut a = Ephemeral::generate();
        let mut b = Ephemeral::generate();
        let (pa, pb) = (a.public, b.public);
        let mut whole = keys(&mut a, &pb, b"secret", b"t", true).unwrap();
        let mut rx = keys(&mut b, &pa, b"secret", b"t", false).unwrap();
        let mut split = Keys { tx: whole.tx, rx: whole.rx, next: whole.next, window: ReplayWindow::default() };
        let mut out = Vec::new();
        let big = ONE_PASS_COPY_MAX;
        let sizes = [(0, 0), (1, 0), (40, 24), (1500, 24), (9000, 24), (9000, 8999), (64, 64), (8999, 1)];
        let past = [(big + 1, 0), (big + 1, 1), (big + 1000, 999), (40000, 24), (40000, 40000 - big)];
        for (size, cut) in sizes.into_iter().chain(past) {
            let payload: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
            let mut one = frame(&payload);
            let len = one.len() - TRAILER_LEN;
            let n = whole.seal(&mut one, len);
            let mut two = frame(&payload[..cut]);
            two.resize(one.len(), 0);
            let head_len = HEADER_LEN + cut;
            // The header's payload length is the whole payload's, as `emit_data` writes it.
            two[..HEADER_LEN].copy_from_slice(&frame(&payload)[..HEADER_LEN]);
            let m = split.seal_with(&mut two, head_len, &payload[cut..]);
            assert_eq!((n, &one), (m, &two), "payload {size} cut at {cut}");
            let opened = rx.open(&two, &mut out).unwrap();
            assert_eq!(opened, HEADER_LEN + size);
            let f = Frame::new_checked(&out[..opened]).expect("the opened frame passes every check");
            assert_eq!(f.payload(), &payload[..], "payload {size} cut at {cut}");
        }
    }

    // Checks every single-bit flip anywhere in a sealed frame (header, payload, counter, tag)
    // is refused, and that a refused frame does not use up its counter: the genuine frame is
    // still taken after its forgeries.
    #[test]
    fn any_flipped_bit_is_refused() {
        let (mut a, mut b) = pair();
        let mut buf = frame(&[0x5a; 40]);
        let l = buf.len() - TRAILER_LEN;
        a.seal(&mut buf, l);
        let mut out = Vec::new();
        for i in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let r = b.open(&bad, &mut out);
            assert!(matches!(r, Err(Unsealed::Forged | Unsealed::Malformed | Unsealed::Replayed)), "bit {i}: {r:?}");
        }
        b.open(&buf, &mut out).unwrap();
    }

    // Checks replays: a frame taken once is refused the second time; frames arriving out of
    // order within the window are each taken once; a counter older than the window is refused.
    #[test]
    fn each_counter_is_taken_once() {
        let (mut a, mut b) = pair();
        let mut frames = Vec::new();
        for i in 0..(REPLAY_WINDOW + 10) {
            let mut buf = frame(&i.to_be_bytes());
            let l = buf.len() - TRAILER_LEN;
            a.seal(&mut buf, l);
            frames.push(buf);
        }
        let mut out = Vec::new();
        // 0 and 2 first, then 1, then 2 again.
        b.open(&frames[0], &mut out).unwrap();
        b.open(&frames[2], &mut out).unwrap();
        b.open(&frames[1], &mut out).unwrap();
        assert_eq!(b.open(&frames[2], &mut out), Err(Unsealed::Replayed));
        assert_eq!(b.open(&frames[0], &mut out), Err(Unsealed::Replayed));
        // Jump to the newest: frame 3 is now more than a window behind, frame 11 just inside.
        let last = frames.len() - 1;
        b.open(&frames[last], &mut out).unwrap();
        assert_eq!(b.open(&frames[3], &mut out), Err(Unsealed::Replayed));
        b.open(&frames[11], &mut out).unwrap();
        assert_eq!(b.open(&frames[11], &mut out), Err(Unsealed::Replayed));
        assert_eq!(b.open(&frames[last], &mut out), Err(Unsealed::Replayed));
    }

    // Checks the window's bookkeeping against a plain set of taken counters over a random
    // walk of arrivals (reordered, repeated, far jumps): both agree on every decision.
    #[test]
    fn replay_window_matches_a_set() {
        let mut w = ReplayWindow::default();
        let mut taken = std::collections::BTreeSet::new();
        let mut top = 0u64;
        let mut x = 12345u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let c = match x % 10 {
                0 => top + (x >> 8) % (3 * REPLAY_WINDOW),
                1..=6 => top + (x >> 8) % 4,
                _ => top.saturating_sub((x >> 8) % (REPLAY_WINDOW + 50)),
            };
            let expect = !taken.contains(&c) && (c >= top || top - c <= REPLAY_WINDOW);
            assert_eq!(w.fresh(c), expect, "counter {c}, top {top}");
            if expect {
                w.take(c);
                taken.insert(c);
                top = top.max(c + 1);
            }
        }
    }

    // Checks that keys from different fabric secrets, or different transcripts, do not open
    // each other's frames (the secret and the transcript are bound into the keys).
    #[test]
    fn keys_bind_secret_and_transcript() {
        for (secret_b, transcript_b) in [(&b"other"[..], &b"t"[..]), (&b"secret"[..], &b"u"[..])] {
            let mut a = Ephemeral::generate();
            let mut b = Ephemeral::generate();
            let (pa, pb) = (a.public, b.public);
            let mut ka = keys(&mut a, &pb, b"secret", b"t", true).unwrap();
            let mut kb = keys(&mut b, &pa, secret_b, transcript_b, false).unwrap();
            let mut buf = frame(b"x");
            let l = buf.len() - TRAILER_LEN;
            ka.seal(&mut buf, l);
            assert_eq!(kb.open(&buf, &mut Vec::new()), Err(Unsealed::Forged));
        }
    }
}
