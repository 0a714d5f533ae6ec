//! What a process taking over from another (a binary upgrade) brings to
//! the L4 plane: the steering program loaded ahead; the BPF links through
//! which the one before attached its programs and its AF_XDP sockets,
//! received with the listening sockets (the new program, its maps made
//! and the old sockets in its socket map, goes in behind each link in one
//! step while the old process still serves: the interfaces are never
//! without a program); and the sessions the one before hands on, so that connections under way keep their real server
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
//! With the sessions go the frames each AF_XDP socket held unused when
//! its worker stopped: the new process adopts the sockets themselves
//! (`xsk::Socket::adopt`), so nothing waits for a queue to be freed and
//! no packet that came meanwhile is lost.
//!
//! ```text
//!  0  4  magic "GHL4"
//!  4  1  version (2; 1 had no sockets)
//!  5  4  record count (big endian)
//!  9  80 × count: records (gatehouse_l4::sync's layout)
//!  then, version 2: a socket count (4), and per socket the interface's
//!  name (1-byte length, bytes), the queue (4), a frame count (4) and the
//!  frames' UMEM offsets (8 each); all big endian
//! ```

use gatehouse_l4::sync::{RECORD_LEN, Record};
use gatehouse_plane::listeners::{XdpHandover, XdpSocket};
use std::collections::HashMap;

use crate::steer::{Loaded, Steering};

const MAGIC: [u8; 4] = *b"GHL4";
const VERSION: u8 = 2;
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
    /// its sockets, which the start adopts.
    pub prepared: HashMap<String, (Steering, Vec<XdpSocket>)>,
    /// The frames each of the previous process's sockets held unused, by
    /// (interface, queue).
    pub frames: HashMap<(String, u32), Vec<u64>>,
}

/// One AF_XDP socket's unused frames when its worker stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    pub interface: String,
    pub queue: u32,
    pub free: Vec<u64>,
}

/// What a process being replaced hands on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandedOn {
    pub sessions: Vec<Record>,
    pub frames: Vec<Frames>,
}

/// `records` and `frames` in the handover format; past [`MAX_RECORDS`]
/// the rest of the records are left out (the caller says how many).
pub fn encode(records: &[Record], frames: &[Frames]) -> Vec<u8> {
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
    out.extend_from_slice(&(frames.len() as u32).to_be_bytes());
    for f in frames {
        let name = &f.interface.as_bytes()[..f.interface.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&f.queue.to_be_bytes());
        out.extend_from_slice(&(f.free.len() as u32).to_be_bytes());
        f.free.iter().for_each(|a| out.extend_from_slice(&a.to_be_bytes()));
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

/// A handed-over state, all or none (version 1 or 2).
pub fn decode(b: &[u8]) -> Result<HandedOn, Refused> {
    if b.len() < HEADER_LEN || b[..4] != MAGIC || !(1..=VERSION).contains(&b[4]) {
        return Err(Refused::Format);
    }
    let count = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) as usize;
    let body = &b[HEADER_LEN..];
    if count > MAX_RECORDS || body.len() < count * RECORD_LEN || (b[4] == 1 && body.len() != count * RECORD_LEN) {
        return Err(Refused::Length);
    }
    let (records, mut rest) = body.split_at(count * RECORD_LEN);
    let sessions = records
        .chunks_exact(RECORD_LEN)
        .enumerate()
        .map(|(i, c)| {
            let rec: &[u8; RECORD_LEN] = c.try_into().map_err(|_| Refused::Record(i))?;
            Record::read(rec).map_err(|_| Refused::Record(i))
        })
        .collect::<Result<_, _>>()?;
    let mut frames = Vec::new();
    if b[4] >= 2 {
        let sockets = take_u32(&mut rest)?;
        for _ in 0..sockets {
            let (&len, tail) = rest.split_first().ok_or(Refused::Length)?;
            let (name, tail) = tail.split_at_checked(usize::from(len)).ok_or(Refused::Length)?;
            rest = tail;
            let interface = std::str::from_utf8(name).map_err(|_| Refused::Format)?.to_string();
            let queue = take_u32(&mut rest)?;
            let n = take_u32(&mut rest)? as usize;
            let (addrs, tail) =
                rest.split_at_checked(n.checked_mul(8).ok_or(Refused::Length)?).ok_or(Refused::Length)?;
            rest = tail;
            let free = addrs.chunks_exact(8).map(|c| u64::from_be_bytes(c.try_into().unwrap_or_default())).collect();
            frames.push(Frames { interface, queue, free });
        }
        if !rest.is_empty() {
            return Err(Refused::Length);
        }
    }
    Ok(HandedOn { sessions, frames })
}

fn take_u32(b: &mut &[u8]) -> Result<u32, Refused> {
    let (head, tail) = b.split_at_checked(4).ok_or(Refused::Length)?;
    *b = tail;
    Ok(u32::from_be_bytes([head[0], head[1], head[2], head[3]]))
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
        let frames = vec![
            Frames { interface: "lb0".into(), queue: 0, free: vec![0, 2048, 8 << 20] },
            Frames { interface: "eth1".into(), queue: 3, free: vec![] },
        ];
        assert_eq!(decode(&encode(&recs, &frames)), Ok(HandedOn { sessions: recs.clone(), frames }));
        assert_eq!(decode(&encode(&[], &[])), Ok(HandedOn::default()));
        // Version 1 (no sockets), as the binary before sends it.
        let mut v1 = encode(&recs, &[]);
        v1[4] = 1;
        v1.truncate(v1.len() - 4);
        assert_eq!(decode(&v1), Ok(HandedOn { sessions: recs, frames: vec![] }));
    }

    #[test]
    fn anything_else_is_refused_whole() {
        let frames = [Frames { interface: "lb0".into(), queue: 0, free: vec![0, 2048] }];
        let good = encode(&[rec(1, false), rec(2, true)], &frames);
        assert_eq!(decode(&good[..HEADER_LEN - 1]), Err(Refused::Format));
        let mut other = good.clone();
        other[4] = 3;
        assert_eq!(decode(&other), Err(Refused::Format));
        // Cut anywhere in the sockets' part, or anything after it.
        for cut in 1..=8 + 4 + 4 + 4 + 3 {
            assert_eq!(decode(&good[..good.len() - cut]), Err(Refused::Length), "{cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(Refused::Length));
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
