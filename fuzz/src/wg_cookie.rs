//! Cookie replies (`wg::cookie`, RFC-less but in the WireGuard paper
//! §5.4.7). Input: one byte of choices, then a datagram given to the
//! initiator as a cookie reply from the responder, which is under load.
//! The choices: bit 0, the datagram goes to the responder too; bit 1, the
//! genuine cookie reply arrives before it rather than after.
//!
//! Properties: no panic; a forged or damaged reply never stops the
//! genuine one from working: once the initiator has it, its next
//! initiation (mac2 set) gets a response from the loaded responder.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use gatehouse_wg::device::Transmit;
use gatehouse_wg::messages::COOKIE_REPLY;

use crate::wg_pair::{A, B, Dev, addr, cached, deliver, packet, pair, start};

/// The initiator and the loaded responder after the responder answered
/// the first initiation, and its genuine cookie reply: made once per
/// thread (seeded, so the same every time) and cloned for each run.
type Ready = (Dev, Dev, Vec<Transmit>);

fn prepared() -> Ready {
    thread_local!(static READY: RefCell<HashMap<u64, Ready>> = RefCell::new(HashMap::new()));
    cached(&READY, 9, || {
        let t0 = start();
        let (mut a, mut b) = pair(t0, 9);
        b.set_under_load(true);
        let mut out = Vec::new();
        let _ = a.send(&packet(10), t0, &mut out);
        let replies = deliver(&mut b, A, out, t0);
        let genuine: Vec<Transmit> =
            replies.into_iter().filter(|t| t.datagram.first() == Some(&COOKIE_REPLY)).collect();
        assert_eq!(genuine.len(), 1, "a loaded responder answers an initiation with a cookie reply");
        (a, b, genuine)
    })
}

pub fn run(data: &[u8]) {
    let Some((&choices, forged)) = data.split_first() else { return };
    let t0 = start();
    let (mut a, mut b, genuine) = prepared();
    let forged = vec![Transmit { to: addr(A), datagram: forged.to_vec() }];
    if choices & 1 != 0 {
        let _ = deliver(&mut b, A, forged.clone(), t0);
    }
    if choices & 2 != 0 {
        let _ = deliver(&mut a, B, genuine, t0);
        let _ = deliver(&mut a, B, forged, t0);
    } else {
        let _ = deliver(&mut a, B, forged, t0);
        let _ = deliver(&mut a, B, genuine, t0);
    }
    // The initiator retries after the rekey timeout, with mac2.
    let later = t0 + Duration::from_secs(6);
    let mut retry = Vec::new();
    let _ = a.tick(later, &mut retry);
    assert!(!retry.is_empty(), "the initiator did not retry");
    let back = deliver(&mut b, A, retry, later);
    assert!(back.iter().any(|t| t.datagram.first() == Some(&2)), "the cookie did not get the initiation through");
}
