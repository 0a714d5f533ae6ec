//! Router mode across a binary upgrade (`--takeover`), as the L4 plane
//! does it: the process before hands on the BPF links its programs are
//! attached through and the AF_XDP socket of every queue of both NICs,
//! each with its UMEM (`gatehouse_plane::listeners`). While it still
//! routes, the new process makes its programs' maps, puts the old sockets
//! in its socket maps and swaps its programs in behind both links
//! ([`super::runtime::RouterShared::prepare_takeover`]): the old workers go on through the
//! new programs. The old process then stops its workers, which say which
//! frames they held unused ([`Frames`]), and hands its sessions on; the
//! new one adopts the sockets (`xsk::Socket::adopt`) with those frames, and
//! what came meanwhile waits in the same receive rings. The NICs are
//! never without a program and no queue changes socket, so no packet is
//! lost.
//!
//! Where anything of that cannot be (an older predecessor, a socket that
//! does not add up), the new process lets the links go and attaches anew
//! once the old one has let the NICs go, as a fresh start does, waiting
//! for the queues the old sockets held.

use std::collections::HashMap;

use gatehouse_link::xsk;
use gatehouse_plane::listeners::{XdpSocket, adopt_xdp_sockets};

use super::steer::Nic;

/// The frames one socket held unused when its worker stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frames {
    pub nic: Nic,
    pub queue: u32,
    pub free: Vec<u64>,
}

/// What a takeover brought router mode, until its start.
#[derive(Default)]
pub struct Takeover {
    /// The predecessor's sockets of the LAN and the WAN side, behind the
    /// programs swapped in ahead.
    pub prepared: Option<[Vec<XdpSocket>; 2]>,
    /// The predecessor handed its links over (its sockets held the queues).
    pub handed: bool,
    /// The frames its sockets held unused, by side and queue.
    frames: HashMap<(Nic, u32), Vec<u64>>,
}

impl Takeover {
    /// The predecessor's sockets, adopted, as (LAN, WAN) pairs by queue:
    /// `None` unless each of the `queues` pairs can be (those adopted
    /// close then). `nics`: the LAN and WAN NICs' names.
    pub fn adopt(&mut self, queues: usize, nics: [&str; 2]) -> Option<Vec<(xsk::Socket, xsk::Socket)>> {
        let [lan, wan] = self.prepared.take()?;
        let frames = &mut self.frames;
        let mut side =
            |nic: Nic, sockets| adopt_xdp_sockets(nics[nic.index()], sockets, queues, |q| frames.remove(&(nic, q)));
        let lan = side(Nic::Lan, lan)?;
        let wan = side(Nic::Wan, wan)?;
        Some(lan.into_iter().zip(wan).collect())
    }

    /// The frames the predecessor's sockets held unused, from the state
    /// it handed over.
    pub fn set_frames(&mut self, frames: Vec<Frames>) {
        self.frames = frames.into_iter().map(|f| ((f.nic, f.queue), f.free)).collect();
    }
}

/// `frames` as the state handed over carries them: a count (4), then per
/// socket the side (1: 0 LAN, 1 WAN), the queue (4), a frame count (4) and
/// the frames' UMEM offsets (8 each); little endian, as the rest of the
/// WireGuard plane's state.
pub fn encode(frames: &[Frames]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for f in frames {
        out.push(f.nic.index() as u8);
        out.extend_from_slice(&f.queue.to_le_bytes());
        out.extend_from_slice(&(f.free.len() as u32).to_le_bytes());
        for a in &f.free {
            out.extend_from_slice(&a.to_le_bytes());
        }
    }
    out
}

/// The frames [`encode`] wrote; `None` if `b` does not hold exactly that.
pub fn decode(b: &[u8]) -> Option<Vec<Frames>> {
    let (count, mut b) = b.split_first_chunk::<4>()?;
    let mut out = Vec::new();
    for _ in 0..u32::from_le_bytes(*count) {
        let (&side, rest) = b.split_first()?;
        let nic = match side {
            0 => Nic::Lan,
            1 => Nic::Wan,
            _ => return None,
        };
        let (queue, rest) = rest.split_first_chunk::<4>()?;
        let (n, rest) = rest.split_first_chunk::<4>()?;
        let (addrs, rest) = rest.split_at_checked(usize::try_from(u32::from_le_bytes(*n)).ok()?.checked_mul(8)?)?;
        let free = addrs.chunks_exact(8).map(|a| u64::from_le_bytes(a.try_into().unwrap_or_default())).collect();
        out.push(Frames { nic, queue: u32::from_le_bytes(*queue), free });
        b = rest;
    }
    b.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_the_state_and_nothing_else_passes() {
        let frames = vec![
            Frames { nic: Nic::Lan, queue: 0, free: vec![0, 2048, 4096] },
            Frames { nic: Nic::Wan, queue: 3, free: Vec::new() },
        ];
        let b = encode(&frames);
        assert_eq!(decode(&b), Some(frames));
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
        // Cut short anywhere, one byte too many, or an unknown side.
        for n in 0..b.len() {
            assert_eq!(decode(&b[..n]), None, "cut at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode(&long), None);
        let mut side = b.clone();
        side[4] = 2;
        assert_eq!(decode(&side), None);
        // A frame count whose bytes would overflow is refused, not allocated.
        let mut huge = vec![1, 0, 0, 0, 0, 0, 0, 0, 0];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&huge), None);
    }
}
