//! What a process taking over from another (a binary upgrade) brings to
//! the L4 plane: the steering program loaded ahead; the BPF links through
//! which the one before attached its programs and its AF_XDP sockets,
//! received with the listening sockets (the new program, its maps made
//! and the old sockets in its socket map, goes in behind each link in one
//! step while the old process still serves: the interfaces are never
//! without a program, and once the old sockets close the new ones take
//! their place); and the sessions the one before hands on, so that connections under way keep their real server
//! and FNAT port, whichever scheduler chose them, and a server's reply that
//! comes before its client's next packet still finds its way back.
//!
//! The old process stops its workers, each exports the sessions it owns
//! as session-sync records ([`gatehouse_l4::sync::Record`]), and the node
//! sends them over the control socket. The new process's workers commit
//! every record before they look at their first frame, as a promoted
//! standby commits its peer's. Proxied (SYN-cookie) sessions are not
//! carried: their sequence-number translation is not in a record.
//!
//! ```text
//!  0  4  magic "GHL4"
//!  4  1  version (1)
//!  5  4  record count (big endian)
//!  9  80 × count: records (gatehouse_l4::sync's layout)
//! ```

use gatehouse_l4::sync::{RECORD_LEN, Record};
use gatehouse_plane::listeners::XdpHandover;
use std::collections::HashMap;

use crate::steer::{Loaded, Steering};

const MAGIC: [u8; 4] = *b"GHL4";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 9;
/// The node's control socket carries a plane's state up to 64 MiB.
pub const MAX_RECORDS: usize = ((64 << 20) - HEADER_LEN) / RECORD_LEN;

/// What a process taking over brings to its runtime's start.
#[derive(Default)]
pub struct Handover {
    /// The sessions handed on, which every worker commits before its first
    /// frame.
    pub sessions: Vec<Record>,
    /// The steering program loaded ahead, by interface: once the process
    /// before lets an interface go, only the attach is left.
    pub programs: HashMap<String, Loaded>,
    /// The previous process's XDP links and AF_XDP sockets, by interface.
    pub xdp: HashMap<String, XdpHandover>,
    /// Programs already behind the previous process's links, sending to
    /// its sockets until it lets them go: the start adds this process's
    /// sockets in their place.
    pub prepared: HashMap<String, Steering>,
}

/// `records` in the handover format; past [`MAX_RECORDS`] the rest are
/// left out (the caller says how many).
pub fn encode(records: &[Record]) -> Vec<u8> {
    let records = &records[..records.len().min(MAX_RECORDS)];
    let mut out = Vec::with_capacity(HEADER_LEN + records.len() * RECORD_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(records.len() as u32).to_be_bytes());
    let mut rec = [0u8; RECORD_LEN];
    for r in records {
        r.write(&mut rec);
        out.extend_from_slice(&rec);
    }
    out
}

/// Why a handed-over state was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not this format (or another version of it).
    Format,
    /// The count does not match the length.
    Length,
    /// The record at this index is malformed.
    Record(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Format => write!(f, "not L4 sessions of this version"),
            Refused::Length => write!(f, "the record count does not match the length"),
            Refused::Record(i) => write!(f, "record {i} is malformed"),
        }
    }
}

/// The records of a handed-over state, all or none.
pub fn decode(b: &[u8]) -> Result<Vec<Record>, Refused> {
    if b.len() < HEADER_LEN || b[..4] != MAGIC || b[4] != VERSION {
        return Err(Refused::Format);
    }
    let count = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) as usize;
    let body = &b[HEADER_LEN..];
    if count > MAX_RECORDS || body.len() != count * RECORD_LEN {
        return Err(Refused::Length);
    }
    body.chunks_exact(RECORD_LEN)
        .enumerate()
        .map(|(i, c)| {
            let rec: &[u8; RECORD_LEN] = c.try_into().map_err(|_| Refused::Record(i))?;
            Record::read(rec).map_err(|_| Refused::Record(i))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_l4::session::State;
    use std::net::IpAddr;

    fn rec(port: u16, local: bool) -> Record {
        Record {
            proto: 6,
            state: State::Established,
            ttl: 899,
            client: IpAddr::from([10, 78, 0, 10]),
            client_port: port,
            vip: IpAddr::from([10, 77, 0, 100]),
            vip_port: 80,
            real: IpAddr::from([10, 77, 0, 11]),
            real_port: 8080,
            local: local.then(|| (IpAddr::from([10, 77, 0, 3]), 40000 + port)),
        }
    }

    #[test]
    fn records_go_over_and_come_back_the_same() {
        let v6 = Record {
            client: "2001:db8::1".parse().expect("test"),
            vip: "2001:db8::100".parse().expect("test"),
            real: "2001:db8::11".parse().expect("test"),
            local: None,
            ..rec(7, false)
        };
        let recs = vec![rec(1, false), rec(2, true), v6];
        assert_eq!(decode(&encode(&recs)), Ok(recs));
        assert_eq!(decode(&encode(&[])), Ok(vec![]));
    }

    #[test]
    fn anything_else_is_refused_whole() {
        let good = encode(&[rec(1, false), rec(2, true)]);
        assert_eq!(decode(&good[..HEADER_LEN - 1]), Err(Refused::Format));
        let mut other = good.clone();
        other[4] = 2;
        assert_eq!(decode(&other), Err(Refused::Format));
        assert_eq!(decode(&good[..good.len() - 1]), Err(Refused::Length));
        let mut more = good.clone();
        more[8] = 3;
        assert_eq!(decode(&more), Err(Refused::Length));
        let mut bad = good.clone();
        bad[HEADER_LEN + RECORD_LEN] = 1; // the second record's protocol
        assert_eq!(decode(&bad), Err(Refused::Record(1)));
        // WireGuard's state, or noise, is not L4 sessions.
        assert_eq!(decode(b"\x00\x03wg0\x00\x00\x00\x00"), Err(Refused::Format));
    }
}
