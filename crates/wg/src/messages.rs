//! The four message types on the wire, by field offset, and the parser that
//! sorts a datagram into one of them. A datagram that is none of them (an
//! unknown type, a wrong length, reserved bytes set) is [`Malformed`], to be
//! dropped and counted.

/// Message types.
pub const INITIATION: u8 = 1;
pub const RESPONSE: u8 = 2;
pub const COOKIE_REPLY: u8 = 3;
pub const TRANSPORT: u8 = 4;

/// Handshake initiation (type 1).
pub mod initiation {
    pub const SENDER: usize = 4;
    pub const EPHEMERAL: usize = 8;
    /// The initiator's static key, sealed (32 + 16 bytes).
    pub const STATIC: usize = 40;
    /// The TAI64N timestamp, sealed (12 + 16 bytes).
    pub const TIMESTAMP: usize = 88;
    pub const MAC1: usize = 116;
    pub const MAC2: usize = 132;
    pub const LEN: usize = 148;
}

/// Handshake response (type 2).
pub mod response {
    pub const SENDER: usize = 4;
    pub const RECEIVER: usize = 8;
    pub const EPHEMERAL: usize = 12;
    /// Nothing, sealed (16 bytes of tag).
    pub const EMPTY: usize = 44;
    pub const MAC1: usize = 60;
    pub const MAC2: usize = 76;
    pub const LEN: usize = 92;
}

/// Cookie reply (type 3).
pub mod cookie_reply {
    pub const RECEIVER: usize = 4;
    pub const NONCE: usize = 8;
    /// The cookie, sealed with XChaCha20-Poly1305 (16 + 16 bytes).
    pub const COOKIE: usize = 32;
    pub const LEN: usize = 64;
}

/// Transport data (type 4).
pub mod transport {
    pub const RECEIVER: usize = 4;
    pub const COUNTER: usize = 8;
    pub const DATA: usize = 16;
    /// Header and the tag of an empty (keepalive) packet.
    pub const MIN_LEN: usize = DATA + crate::crypto::TAG_LEN;
}

/// A datagram, sorted.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    Initiation(&'a [u8; initiation::LEN]),
    Response(&'a [u8; response::LEN]),
    CookieReply(&'a [u8; cookie_reply::LEN]),
    Transport { receiver: u32, counter: u64, sealed: &'a [u8] },
}

/// Why a datagram is not a WireGuard message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than a type and its reserved bytes.
    Short,
    UnknownType,
    /// The reserved bytes after the type are not zero.
    Reserved,
    /// Not the length its type has.
    BadLength,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Sorts a datagram into its message type.
pub fn parse(b: &[u8]) -> Result<Message<'_>, Malformed> {
    if b.len() < 4 {
        return Err(Malformed::Short);
    }
    if b[1..4] != [0, 0, 0] {
        return Err(Malformed::Reserved);
    }
    match b[0] {
        INITIATION => b.try_into().map(Message::Initiation).map_err(|_| Malformed::BadLength),
        RESPONSE => b.try_into().map(Message::Response).map_err(|_| Malformed::BadLength),
        COOKIE_REPLY => b.try_into().map(Message::CookieReply).map_err(|_| Malformed::BadLength),
        TRANSPORT => {
            // Senders pad packets to 16 bytes, but not all do (boringtun
            // does not): only shorter than an empty packet's tag is wrong.
            if b.len() < transport::MIN_LEN {
                return Err(Malformed::BadLength);
            }
            let mut counter = [0u8; 8];
            counter.copy_from_slice(&b[transport::COUNTER..transport::DATA]);
            Ok(Message::Transport {
                receiver: le32(b, transport::RECEIVER),
                counter: u64::from_le_bytes(counter),
                sealed: &b[transport::DATA..],
            })
        }
        _ => Err(Malformed::UnknownType),
    }
}

/// The sender index of an initiation or a response.
pub fn sender(m: &[u8]) -> u32 {
    le32(m, initiation::SENDER)
}

/// The receiver index of a response.
pub fn response_receiver(m: &[u8; response::LEN]) -> u32 {
    le32(m, response::RECEIVER)
}

/// The receiver index of a cookie reply.
pub fn cookie_receiver(m: &[u8; cookie_reply::LEN]) -> u32 {
    le32(m, cookie_reply::RECEIVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_has_its_length() {
        let mut init = [0u8; initiation::LEN];
        init[0] = INITIATION;
        assert!(matches!(parse(&init), Ok(Message::Initiation(_))));
        assert_eq!(parse(&init[..147]), Err(Malformed::BadLength));
        let mut resp = [0u8; response::LEN];
        resp[0] = RESPONSE;
        resp[response::RECEIVER] = 7;
        assert!(matches!(parse(&resp), Ok(Message::Response(r)) if response_receiver(r) == 7));
        let mut cookie = [0u8; cookie_reply::LEN];
        cookie[0] = COOKIE_REPLY;
        assert!(matches!(parse(&cookie), Ok(Message::CookieReply(_))));
        let mut data = vec![0u8; transport::MIN_LEN + 32];
        data[0] = TRANSPORT;
        data[transport::RECEIVER] = 9;
        data[transport::COUNTER] = 5;
        assert_eq!(parse(&data), Ok(Message::Transport { receiver: 9, counter: 5, sealed: &data[16..] }));
        assert!(matches!(parse(&data[..transport::MIN_LEN + 5]), Ok(Message::Transport { .. })), "unpadded");
        assert_eq!(parse(&data[..transport::MIN_LEN - 1]), Err(Malformed::BadLength));
    }

    #[test]
    fn anything_else_is_malformed() {
        assert_eq!(parse(&[]), Err(Malformed::Short));
        assert_eq!(parse(&[1, 0, 0]), Err(Malformed::Short));
        assert_eq!(parse(&[5, 0, 0, 0]), Err(Malformed::UnknownType));
        assert_eq!(parse(&[1, 0, 1, 0]), Err(Malformed::Reserved));
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..20_000 {
            let len = rng.usize(..200);
            let mut b: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if len > 0 {
                b[0] = rng.u8(0..6);
            }
            // Never panics; what it accepts has its type's length.
            match parse(&b) {
                Ok(Message::Initiation(_)) => assert_eq!(len, initiation::LEN),
                Ok(Message::Response(_)) => assert_eq!(len, response::LEN),
                Ok(Message::CookieReply(_)) => assert_eq!(len, cookie_reply::LEN),
                Ok(Message::Transport { sealed, .. }) => assert!(sealed.len() >= crate::crypto::TAG_LEN),
                Err(_) => {}
            }
        }
    }
}
