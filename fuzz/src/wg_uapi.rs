//! The WireGuard UAPI text protocol (`wg::uapi`), as `wg set` and
//! `wg syncconf` speak it. Input: a request's text.
//!
//! Properties: no panic; a `set=1` request, written back in the protocol's
//! own form, parses to the same change.

use std::fmt::Write as _;

use gatehouse_wg::uapi::{Change, Request, parse_request};

fn hex(k: &[u8; 32]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

fn write(c: &Change) -> String {
    let mut o = String::from("set=1\n");
    match c.private_key {
        Some(Some(k)) => writeln!(o, "private_key={}", hex(&k)),
        Some(None) => writeln!(o, "private_key={}", hex(&[0; 32])),
        None => Ok(()),
    }
    .ok();
    if let Some(p) = c.listen_port {
        let _ = writeln!(o, "listen_port={p}");
    }
    if let Some(m) = c.fwmark {
        let _ = writeln!(o, "fwmark={m}");
    }
    let _ = writeln!(o, "replace_peers={}", c.replace_peers);
    for p in &c.peers {
        let _ = writeln!(o, "public_key={}", hex(&p.public_key));
        let _ = writeln!(o, "remove={}\nupdate_only={}", p.remove, p.update_only);
        match p.preshared_key {
            Some(Some(k)) => drop(writeln!(o, "preshared_key={}", hex(&k))),
            Some(None) => drop(writeln!(o, "preshared_key={}", hex(&[0; 32]))),
            None => {}
        }
        if let Some(e) = p.endpoint {
            let _ = writeln!(o, "endpoint={e}");
        }
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(o, "persistent_keepalive_interval={k}");
        }
        let _ = writeln!(o, "replace_allowed_ips={}", p.replace_allowed_ips);
        for (a, l) in &p.allowed_ips {
            let _ = writeln!(o, "allowed_ip={a}/{l}");
        }
    }
    o.push('\n');
    o
}

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(Request::Set(change)) = parse_request(&text) else { return };
    let written = write(&change);
    match parse_request(&written) {
        Ok(Request::Set(again)) => assert_eq!(again, change, "written back as {written:?}"),
        other => panic!("{written:?} parses as {other:?}"),
    }
}
