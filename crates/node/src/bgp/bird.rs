//! BIRD 2, as the announcer drives it: the protocols Gatehouse writes into
//! its own include file (a `direct` protocol reading the VIP interface, an
//! export filter with the route attributes, one `bgp` protocol per
//! neighbour), and the control socket's line protocol (`configure`,
//! `show protocols`).

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use gatehouse_config::{Bgp, Community, RouteAttributes};

/// The `direct` protocol that exports the VIP interface's addresses.
pub const VIPS_PROTOCOL: &str = "gatehouse_vips";
/// Every protocol Gatehouse writes is named with this prefix.
pub const PREFIX: &str = "gatehouse_";

/// How long a control-socket exchange may take.
const TIMEOUT: Duration = Duration::from_secs(3);

fn attributes(out: &mut String, a: &RouteAttributes, indent: &str) {
    if let Some(med) = a.med {
        let _ = writeln!(out, "{indent}bgp_med = {med};");
    }
    if let Some(pref) = a.local_pref {
        let _ = writeln!(out, "{indent}bgp_local_pref = {pref};");
    }
    for c in &a.communities {
        let _ = match c {
            Community::Standard(x, y) => writeln!(out, "{indent}bgp_community.add(({x}, {y}));"),
            Community::Large(x, y, z) => writeln!(out, "{indent}bgp_large_community.add(({x}, {y}, {z}));"),
        };
    }
}

fn prefix_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The include file for `bgp`, written from the config at `source`.
pub fn render(b: &Bgp, source: &Path) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# Written by Gatehouse from the bgp section of {}.", source.display());
    let _ = writeln!(o, "# Do not edit: Gatehouse rewrites it when that section changes.");
    let _ = writeln!(o, "# The addresses of interface {:?} are the VIPs this node announces now.\n", b.interface);
    let _ = writeln!(o, "protocol direct {VIPS_PROTOCOL} {{\n\tipv4;\n\tipv6;\n\tinterface \"{}\";\n}}\n", b.interface);
    let _ = writeln!(o, "filter {PREFIX}export {{");
    let _ = writeln!(o, "\tif proto != \"{VIPS_PROTOCOL}\" then reject;");
    // The interface's IPv6 link-local prefix is no VIP.
    let _ = writeln!(o, "\tif net.len != 32 && net.len != 128 then reject;");
    attributes(&mut o, &b.attributes, "\t");
    for v in &b.vips {
        let Some(ip) = v.address else { continue };
        let _ = writeln!(o, "\tif net = {} then {{", prefix_of(ip));
        attributes(&mut o, &v.attributes, "\t\t");
        let _ = writeln!(o, "\t}}");
    }
    let _ = writeln!(o, "\taccept;\n}}\n");
    if b.neighbors.iter().any(|n| n.bfd) {
        let _ = writeln!(o, "protocol bfd {PREFIX}bfd {{\n}}\n");
    }
    for n in &b.neighbors {
        let Some(addr) = n.address else { continue };
        let _ = writeln!(o, "protocol bgp {PREFIX}{} {{", n.name);
        let _ = match n.local_address {
            Some(l) => writeln!(o, "\tlocal {l} as {};", b.asn),
            None => writeln!(o, "\tlocal as {};", b.asn),
        };
        let _ = writeln!(o, "\tneighbor {addr} as {};", n.asn);
        if let Some(id) = b.router_id {
            let _ = writeln!(o, "\trouter id {id};");
        }
        let _ = writeln!(o, "\thold time {};", b.hold_time.as_secs());
        let _ = writeln!(o, "\tconnect retry time 5;");
        if n.bfd {
            let _ = writeln!(o, "\tbfd on;");
        }
        if let Some(p) = &n.password {
            let _ = writeln!(o, "\tpassword \"{p}\";");
        }
        if let Some(ttl) = n.multihop {
            let _ = writeln!(o, "\tmultihop {ttl};");
        }
        let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
        let _ = writeln!(o, "\t{family} {{\n\t\timport none;\n\t\texport filter {PREFIX}export;\n\t}};\n}}\n");
    }
    o
}

/// Why the daemon did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot reach BIRD's control socket {socket}: {source}")]
    Unreachable { socket: String, source: io::Error },
    #[error("BIRD's control socket {socket}: {source}")]
    Io { socket: String, source: io::Error },
    /// BIRD's own answer (`8002 /etc/bird/bird.conf, line 3: syntax error`).
    #[error("BIRD refused {command:?}: {answer}")]
    Refused { command: String, answer: String },
}

/// One command's reply: every line, each as BIRD's code and its text.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub lines: Vec<(u16, String)>,
}

/// Sends `command` to BIRD's control socket and reads its whole reply.
/// A reply ending in an error code (8xxx, 9xxx) is an error.
pub fn ask(socket: &str, command: &str) -> Result<Reply, DaemonError> {
    let unreachable = |source| DaemonError::Unreachable { socket: socket.to_string(), source };
    let s = UnixStream::connect(socket).map_err(unreachable)?;
    let lost = |source| DaemonError::Io { socket: socket.to_string(), source };
    s.set_read_timeout(Some(TIMEOUT)).map_err(lost)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(lost)?;
    let mut r = BufReader::new(s);
    // The greeting: `0001 BIRD 2.0.12 ready.`
    let mut line = String::new();
    r.read_line(&mut line).map_err(lost)?;
    r.get_mut().write_all(format!("{command}\n").as_bytes()).map_err(lost)?;
    let mut reply = Reply::default();
    let mut code = 0;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(lost)? == 0 {
            return Err(lost(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before the reply ended")));
        }
        let text = line.trim_end_matches('\n');
        // `NNNN-text` goes on, `NNNN text` ends the reply, ` text` goes on
        // with the last code.
        let b = text.as_bytes();
        let coded = b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && (b[4] == b' ' || b[4] == b'-');
        if !coded {
            reply.lines.push((code, text.get(1..).unwrap_or("").to_string()));
            continue;
        }
        code = text[..4].parse().unwrap_or(0);
        reply.lines.push((code, text[5..].to_string()));
        if b[4] == b' ' {
            if code >= 8000 {
                return Err(DaemonError::Refused { command: command.to_string(), answer: text[5..].to_string() });
            }
            return Ok(reply);
        }
    }
}

/// `configure`: BIRD reads its config (and so the include file) again.
/// Protocols whose text did not change keep their sessions.
pub fn configure(socket: &str) -> Result<(), DaemonError> {
    ask(socket, "configure").map(|_| ())
}

/// A protocol as `show protocols` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolState {
    pub name: String,
    pub proto: String,
    /// `up`, `start`, `down`...
    pub state: String,
    /// For BGP: `Established`, `Active`, `Connect`...
    pub info: String,
}

impl ProtocolState {
    pub fn established(&self) -> bool {
        self.state == "up" && self.info.starts_with("Established")
    }
}

/// `show protocols`, parsed: one row per protocol (code 1002 and the
/// lines that go on from it).
pub fn protocols(socket: &str) -> Result<Vec<ProtocolState>, DaemonError> {
    Ok(parse_protocols(&ask(socket, "show protocols")?))
}

pub fn parse_protocols(reply: &Reply) -> Vec<ProtocolState> {
    reply
        .lines
        .iter()
        .filter(|(code, _)| *code == 1002)
        .filter_map(|(_, text)| {
            // Name Proto Table State Since(1 or 2 words) Info...
            let words: Vec<&str> = text.split_whitespace().collect();
            let (name, proto, _table, state) = (words.first()?, words.get(1)?, words.get(2)?, words.get(3)?);
            // `Since` is a time, or a date and a time: Info is what follows
            // the last word that has a digit and a ':' or '-'.
            let since = words
                .iter()
                .skip(4)
                .take_while(|w| w.bytes().any(|b| b.is_ascii_digit()) && w.contains([':', '-', '.']))
                .count();
            let info = words.get(4 + since..).map_or(String::new(), |w| w.join(" "));
            Some(ProtocolState { name: name.to_string(), proto: proto.to_string(), state: state.to_string(), info })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Bgp {
        let text = r#"
listeners:
  - { name: web, address: "192.0.2.10:80", announce: true }
  - { name: web6, address: "[2001:db8::10]:80", announce: true }
bgp:
  asn: 65001
  router_id: 10.0.0.2
  med: 10
  communities: ["65001:100", "65001:2:3"]
  neighbors:
    - { name: tor1, address: 10.0.0.1, asn: 65000, bfd: true, local_address: 10.0.0.2 }
    - { name: tor6, address: "2001:db8:1::1", asn: 65000, password: s3cret, multihop: 2 }
  vips:
    - { address: 192.0.2.10, med: 50, local_pref: 90 }
"#;
        let c = gatehouse_config::from_str(text, Path::new("/etc/gatehouse/node.yaml")).expect("valid");
        c.bgp.expect("bgp")
    }

    #[test]
    fn the_include_file_exports_only_the_vip_interface_with_its_attributes() {
        let text = render(&node(), Path::new("/etc/gatehouse/node.yaml"));
        for want in [
            "protocol direct gatehouse_vips {\n\tipv4;\n\tipv6;\n\tinterface \"gh-vip\";\n}",
            "\tif proto != \"gatehouse_vips\" then reject;\n\tif net.len != 32 && net.len != 128 then reject;\n\tbgp_med = 10;\n\tbgp_community.add((65001, 100));\n\tbgp_large_community.add((65001, 2, 3));\n",
            "\tif net = 192.0.2.10/32 then {\n\t\tbgp_med = 50;\n\t\tbgp_local_pref = 90;\n\t}\n\taccept;\n}",
            "protocol bfd gatehouse_bfd {\n}",
            "protocol bgp gatehouse_tor1 {\n\tlocal 10.0.0.2 as 65001;\n\tneighbor 10.0.0.1 as 65000;\n\trouter id 10.0.0.2;\n\thold time 9;\n\tconnect retry time 5;\n\tbfd on;\n\tipv4 {\n\t\timport none;\n\t\texport filter gatehouse_export;\n\t};\n}",
            "protocol bgp gatehouse_tor6 {\n\tlocal as 65001;\n\tneighbor 2001:db8:1::1 as 65000;",
            "\tpassword \"s3cret\";\n\tmultihop 2;\n\tipv6 {",
        ] {
            assert!(text.contains(want), "missing:\n{want}\nin:\n{text}");
        }
    }

    #[test]
    fn show_protocols_rows_are_read_with_one_or_two_word_times() {
        let reply = Reply {
            lines: vec![
                (2002, "Name       Proto      Table      State  Since         Info".into()),
                (1002, "device1    Device     ---        up     11:38:20.376  ".into()),
                (1002, "gatehouse_vips Direct     ---        up     11:38:20.376  ".into()),
                (1002, "gatehouse_tor1 BGP        ---        up     2026-11-25 11:38:24  Established   ".into()),
                (1002, "gatehouse_tor2 BGP        ---        start  11:38:20.376  Active        Socket: Connection refused".into()),
                (0, "".into()),
            ],
        };
        let rows = parse_protocols(&reply);
        assert_eq!(rows.len(), 4);
        assert_eq!(
            (rows[1].name.as_str(), rows[1].proto.as_str(), rows[1].info.as_str()),
            ("gatehouse_vips", "Direct", "")
        );
        assert!(rows[2].established());
        assert_eq!(rows[3].info, "Active Socket: Connection refused");
        assert!(!rows[3].established());
    }

    #[test]
    fn the_control_socket_protocol_is_spoken_to_a_daemon() {
        let dir = std::env::temp_dir().join(format!("gh-bird-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("bird.ctl");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let fake = std::thread::spawn(move || {
            for answer in [
                "0002-Reading configuration from /etc/bird/bird.conf\n0003 Reconfigured\n",
                "0002-Reading configuration from /etc/bird/bird.conf\n8002 /etc/bird/gatehouse.conf, line 3: syntax error\n",
            ] {
                let (mut s, _) = listener.accept().expect("accept");
                s.write_all(b"0001 BIRD 2.0.12 ready.\n").expect("greet");
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).expect("command");
                assert_eq!(line, "configure\n");
                s.write_all(answer.as_bytes()).expect("answer");
            }
        });
        let socket = path.to_str().expect("utf-8");
        configure(socket).expect("reconfigured");
        let err = configure(socket).expect_err("refused");
        assert_eq!(err.to_string(), "BIRD refused \"configure\": /etc/bird/gatehouse.conf, line 3: syntax error");
        fake.join().expect("fake daemon");
        let gone = configure(dir.join("none.ctl").to_str().expect("utf-8")).expect_err("no daemon");
        assert!(matches!(gone, DaemonError::Unreachable { .. }), "{gone}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
