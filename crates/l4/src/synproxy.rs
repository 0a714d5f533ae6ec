//! SYN cookies for the SYN proxy, I/O-free (the segments it writes are
//! `rewrite::write`'s).
//!
//! Under a SYN flood a protected service answers SYNs itself, keeping no
//! state: its SYN-ACK's sequence number is a cookie, a keyed hash of the
//! connection's addresses, ports and initial sequence number, the time and
//! the MSS chosen. Only a client that answers with the cookie (an ACK of
//! `cookie + 1`) proves it owns its address; then the plane opens the
//! session and the connection to the real server, and translates sequence
//! numbers for the rest of the connection (see `plane::synproxy`).
//!
//! The cookie (32 bits): the time counter (64-second steps) modulo 32 in
//! bits 31-27, the MSS index in bits 26-24, and 24 bits of SipHash-2-4 under
//! the process's secret over the time counter, both endpoints, the client's
//! initial sequence number and the MSS index. A cookie is good for the
//! step it was made in and the next (64 to 128 seconds). The time counter is
//! inside the hash, so each step is in effect a new key.
//!
//! Only MSS is offered in the SYN-ACK (and asked for in the SYN to the real
//! server): window scaling, SACK and timestamps are knowingly dropped for
//! proxied connections, as the cookie has no room to carry them and both
//! halves must agree.

use std::net::IpAddr;

use gatehouse_wire::field::tcp;

/// MSS values a cookie can encode (index 0-7), each what common paths
/// carry.
pub const MSS_TABLE: [u16; 8] = [536, 1200, 1220, 1300, 1360, 1440, 1460, 8960];

/// Seconds per time step of the cookies.
pub const STEP: u32 = 64;

/// SipHash-2-4 (Aumasson and Bernstein) of `data` under `key`.
pub fn siphash24(key: [u64; 2], data: &[u8]) -> u64 {
    let mut v = [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let m = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    }
    let rest = chunks.remainder();
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    last[7] = data.len() as u8;
    let m = u64::from_le_bytes(last);
    v[3] ^= m;
    round(&mut v);
    round(&mut v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// A connection as the cookie sees it: client, then service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ends {
    pub client: IpAddr,
    pub client_port: u16,
    pub vip: IpAddr,
    pub vip_port: u16,
}

fn hash(secret: [u64; 2], step: u32, e: &Ends, isn: u32, mss_idx: u8) -> u32 {
    let mut b = [0u8; 48];
    let a16 = |a: IpAddr| match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    b[..16].copy_from_slice(&a16(e.client));
    b[16..32].copy_from_slice(&a16(e.vip));
    b[32..34].copy_from_slice(&e.client_port.to_be_bytes());
    b[34..36].copy_from_slice(&e.vip_port.to_be_bytes());
    b[36..40].copy_from_slice(&isn.to_be_bytes());
    b[40..44].copy_from_slice(&step.to_be_bytes());
    b[44] = mss_idx;
    (siphash24(secret, &b) & 0x00ff_ffff) as u32
}

/// The largest MSS of the table at most the client's (536 if it gave none).
pub fn mss_index(client_mss: Option<u16>) -> u8 {
    let m = client_mss.unwrap_or(536);
    MSS_TABLE.iter().rposition(|&x| x <= m).unwrap_or(0) as u8
}

/// The cookie for a SYN at `now` (seconds).
pub fn make(secret: [u64; 2], now: u32, e: &Ends, isn: u32, mss_idx: u8) -> u32 {
    let step = now / STEP;
    (step % 32) << 27 | u32::from(mss_idx & 7) << 24 | hash(secret, step, e, isn, mss_idx & 7)
}

/// Checks the cookie an ACK returns (`ack - 1`) for a client whose initial
/// sequence number was `seq - 1`; the MSS it encoded if good.
pub fn check(secret: [u64; 2], now: u32, e: &Ends, isn: u32, cookie: u32) -> Option<u16> {
    let step = now / STEP;
    let mss_idx = ((cookie >> 24) & 7) as u8;
    let made = [step, step.wrapping_sub(1)].into_iter().find(|s| s % 32 == cookie >> 27)?;
    (hash(secret, made, e, isn, mss_idx) == cookie & 0x00ff_ffff).then(|| MSS_TABLE[usize::from(mss_idx)])
}

/// The MSS option of a SYN's TCP header (`seg`: the segment), if any.
pub fn syn_mss(seg: &[u8]) -> Option<u16> {
    let hl = usize::from(seg.get(tcp::DATA_OFF)? >> 4) * 4;
    let mut opts = seg.get(tcp::MIN_HEADER_LEN..hl)?;
    while let Some(&kind) = opts.first() {
        match kind {
            0 => return None,
            1 => opts = &opts[1..],
            _ => {
                let len = usize::from(*opts.get(1)?);
                if len < 2 || len > opts.len() {
                    return None;
                }
                if kind == 2 && len == 4 {
                    return Some(u16::from_be_bytes([opts[2], opts[3]]));
                }
                opts = &opts[len..];
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::packet::{self, Checks, Frame};

    #[test]
    fn siphash_matches_the_reference_vectors() {
        // The paper's vector: key 00..0f, message 00..0e.
        let key = [u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]), u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15])];
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(key, &msg), 0xa129_ca61_49be_45e5);
        // The reference implementation's vectors for lengths 0 and 8.
        assert_eq!(siphash24(key, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(key, &[0, 1, 2, 3, 4, 5, 6, 7]), 0x93f5_f579_9a93_2462);
    }

    fn ends() -> Ends {
        Ends {
            client: "10.0.0.1".parse().expect("v4"),
            client_port: 40000,
            vip: "10.0.0.100".parse().expect("v4"),
            vip_port: 80,
        }
    }

    #[test]
    fn cookies_check_within_two_steps_and_only_for_their_connection() {
        let key = [1, 2];
        let e = ends();
        let c = make(key, 1000, &e, 7777, mss_index(Some(1460)));
        assert_eq!(check(key, 1000, &e, 7777, c), Some(1460));
        assert_eq!(check(key, 1000 + STEP, &e, 7777, c), Some(1460));
        assert_eq!(check(key, 1000 + 2 * STEP + STEP, &e, 7777, c), None, "expired");
        assert_eq!(check(key, 1000, &e, 7778, c), None, "another ISN");
        assert_eq!(check([1, 3], 1000, &e, 7777, c), None, "another secret");
        let mut other = e;
        other.client_port += 1;
        assert_eq!(check(key, 1000, &other, 7777, c), None, "another port");
        // Random guesses almost never pass (24 bits of hash).
        let mut rng = fastrand::Rng::with_seed(4);
        let passed = (0..200_000).filter(|_| check(key, 1000, &e, 7777, rng.u32(..)).is_some()).count();
        assert!(passed <= 2, "{passed}");
    }

    #[test]
    fn mss_is_rounded_down_to_the_table() {
        assert_eq!(MSS_TABLE[usize::from(mss_index(Some(1460)))], 1460);
        assert_eq!(MSS_TABLE[usize::from(mss_index(Some(1448)))], 1440);
        assert_eq!(MSS_TABLE[usize::from(mss_index(Some(100)))], 536);
        assert_eq!(MSS_TABLE[usize::from(mss_index(None))], 536);
        assert_eq!(MSS_TABLE[usize::from(mss_index(Some(9000)))], 8960);
    }

    #[test]
    fn written_segments_parse_with_valid_checksums() {
        use crate::rewrite::{Segment, shift32, write};
        for (src, dst) in [("10.0.0.100", "10.0.0.1"), ("2001:db8::100", "2001:db8::1")] {
            let mut f = vec![0u8; 200];
            f[12..14].copy_from_slice(&if src.contains(':') { [0x86, 0xdd] } else { [8, 0] });
            let s = Segment {
                src: src.parse().expect("ip"),
                dst: dst.parse().expect("ip"),
                sport: 80,
                dport: 40000,
                seq: 12345,
                ack: 999,
                flags: packet::TCP_SYN | packet::TCP_ACK,
                window: 65535,
                mss: Some(1460),
            };
            let end = write(&mut f, 14, &s, b"").expect("room");
            let Ok(Frame::Ip(ip)) = packet::parse(&f[..end], Checks::default()) else { panic!("parses: {src}") };
            assert_eq!((ip.flow.sport, ip.flow.dport, ip.tcp_flags), (80, 40000, s.flags));
            assert_eq!(syn_mss(&f[ip.l4..end]), Some(1460));
            // Shifting the sequence number keeps the checksum valid.
            shift32(&mut f, ip.l4, tcp::SEQ, 0xdead_beef);
            assert!(packet::parse(&f[..end], Checks::default()).is_ok());
            // With data.
            let end = write(&mut f, 14, &Segment { mss: None, flags: packet::TCP_ACK, ..s }, b"hello").expect("room");
            assert!(matches!(packet::parse(&f[..end], Checks::default()), Ok(Frame::Ip(_))));
        }
    }
}
