//! Gatehouse's benchmark tools: what `gatehouse bench …` runs. Each
//! measures one thing on this machine and ends with one line per result
//! (`key=value` pairs) for the scripts in `bench/` to read. No production
//! crate carries benchmark code: this crate depends on the planes, never
//! the other way round.
//!
//! - [`keyops`]: private-key operations per second, per engine;
//! - [`wg_crypto`]: WireGuard's packet AEAD, batched against BoringSSL;
//! - [`wg_router`]: WireGuard's router mode fed from memory on one core;
//! - [`l4`]: the L4 pipeline fed from memory on one core;
//! - [`l4_wire`]: a packet generator on a real (virtual) link, through
//!   XDP ([`bpf_run`], `bpf/trafficgen.c`) or an AF_XDP socket;
//! - [`tls`]: full TLS handshakes against a server.
//!
//! `unsafe` only in [`bpf_run`] (the bpf(2) system call).

use std::process::ExitCode;

use clap::Subcommand;

pub mod bpf_run;
mod error;
pub mod keyops;
pub mod l4;
pub mod l4_wire;
pub mod tls;
pub mod wg_crypto;
pub mod wg_router;

pub use error::BenchError;

#[derive(Subcommand)]
pub enum Bench {
    /// Private-key operations per second on one core, per engine and key size:
    /// `keyops engine=mb key=rsa2048 ops_per_sec=N`.
    Keyops {
        /// Seconds per engine and key size.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// RSA sizes to measure (ECDSA P-256 is always measured).
        #[arg(long, value_delimiter = ',', default_values_t = [2048u32, 3072, 4096])]
        rsa: Vec<u32>,
    },
    /// WireGuard's packet AEAD on one core: the batched engine against
    /// BoringSSL, per packet size and batch size. Ends with one line each:
    /// `wgcrypto engine=mb size=64 batch=16 pps=N`.
    WgCrypto {
        /// Seconds per engine, size and batch.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Packet sizes (bytes of plaintext).
        #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128, 256, 512, 1420])]
        sizes: Vec<usize>,
        /// Packets per batch.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16, 64])]
        batches: Vec<usize>,
    },
    /// WireGuard's router mode fed from memory on one core: LAN frames
    /// sealed toward the WAN and peers' datagrams opened toward the LAN,
    /// round-robin over the peers. One line per case:
    /// `wgrouter dir=seal size=66 peers=1000 pps=N gbps=N cycles_per_packet=N`.
    WgRouter {
        /// Seconds per direction, size and peer count.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Clear frame sizes on the LAN, Ethernet header included.
        #[arg(long, value_delimiter = ',', default_values_t = [66usize, 1420])]
        sizes: Vec<usize>,
        /// Peer counts.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 1000])]
        peers: Vec<usize>,
        /// Frames per vector.
        #[arg(long, default_value_t = gatehouse_wg_io::router::VECTOR)]
        vector: usize,
    },
    /// The L4 pipeline fed from memory on one core: new sessions/s, Mpps of
    /// established flows, bytes per session. One line per case:
    /// `l4 mode=nat proto=udp sessions=N mpps=N new_sessions_per_sec=N bytes_per_session=N`.
    L4 {
        /// Seconds of established traffic per case.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Table sizes (sessions) to measure.
        #[arg(long, value_delimiter = ',', default_values_t = [1_000_000usize])]
        sessions: Vec<usize>,
        /// Forwarding modes: nat, fnat, dr, ipip, gue.
        #[arg(long, value_delimiter = ',', default_values_t = ["nat".to_string(), "fnat".to_string(), "dr".to_string()])]
        modes: Vec<String>,
        /// Protocols: tcp, udp.
        #[arg(long, value_delimiter = ',', default_values_t = ["tcp".to_string(), "udp".to_string()])]
        protos: Vec<String>,
        /// Run the cases here instead of one fresh process each (a fresh
        /// process is what makes resident-memory growth per session honest).
        #[arg(long, hide = true)]
        in_process: bool,
        /// Each case with session sync off, then on (l4.ha.sync as a master
        /// runs it), and the sync channel's own cost per session:
        /// `l4-sync sealed_per_sec=N opened_per_sec=N committed_per_sec=N`.
        #[arg(long)]
        sync: bool,
        /// (A fresh process's one case, with sync on.)
        #[arg(long, hide = true)]
        sync_on: bool,
        /// Only the SYN proxy under a flood: SYNs answered with cookies per
        /// second, `l4-synflood cookies_per_sec=N sessions=0`.
        #[arg(long)]
        syn_flood: bool,
    },
    /// Send 64-byte packets of a fixed set of flows out of an interface
    /// (AF_XDP), for a bounded time, to measure whatever forwards them.
    /// Ends with `l4-wire sent=N seconds=N pps=N`.
    L4Wire {
        /// The interface to send from.
        #[arg(long)]
        interface: String,
        /// xdp: frames made and sent by the kernel with XDP (as a NIC hands
        /// them over); af_xdp: written into an AF_XDP socket.
        #[arg(long, default_value = "xdp")]
        via: String,
        /// The MAC address to send to (the forwarder's interface).
        #[arg(long)]
        dst_mac: String,
        /// Source address of the packets.
        #[arg(long)]
        src: std::net::Ipv4Addr,
        /// Destination address and port (a VIP).
        #[arg(long)]
        dst: std::net::SocketAddrV4,
        /// udp, or tcp (a SYN per flow first, then ACKs).
        #[arg(long, default_value = "udp")]
        proto: String,
        /// Flows (source ports from 10000 on).
        #[arg(long, default_value_t = 1000)]
        flows: u16,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Packets per second, smoothly paced (--via af_xdp only); 0 for as
        /// fast as it can.
        #[arg(long, default_value_t = 0)]
        pps: u64,
    },
    /// Full TLS handshakes against a server: N connections each loop connect,
    /// handshake (never resumed), one GET with `Connection: close`, close.
    /// Ends with `tls handshakes_per_sec=N p50_ms=N p99_ms=N errors=N`
    /// (latencies from the TCP connect to the end of the handshake).
    Tls {
        /// https://host[:port][/path]
        url: String,
        /// Concurrent connections.
        #[arg(short, long, default_value_t = 50)]
        connections: usize,
        /// Client threads (each its own event loop).
        #[arg(short, long, default_value_t = 1)]
        threads: usize,
        /// Stop starting connections after this many seconds.
        #[arg(short, long, default_value_t = 10.0)]
        duration: f64,
        /// Stop after this many connections (whichever comes first).
        #[arg(short = 'n', long)]
        handshakes: Option<u64>,
        /// Only this TLS version: 1.2 or 1.3.
        #[arg(long)]
        tls: Option<String>,
        /// TLS 1.2 cipher list, e.g. ECDHE-RSA-AES256-GCM-SHA384.
        #[arg(long)]
        ciphers: Option<String>,
        /// Key-exchange groups offered, first preferred (TLS 1.3 sends a key share
        /// for the first only; TLS 1.2 ECDSA certificates need their curve listed).
        #[arg(long, default_value = "X25519:P-256")]
        groups: String,
        /// Signature algorithms offered, e.g. rsa_pss_rsae_sha256 or rsa_pkcs1_sha256.
        #[arg(long)]
        sigalgs: Option<String>,
        /// Connect to this address instead of resolving the URL's host.
        #[arg(long)]
        connect: Option<std::net::SocketAddr>,
        /// Seconds a connection may take from connect to the end of the response.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
}

/// Prints a benchmark's result lines on standard output, or its error.
fn print_rows<R: std::fmt::Display, E: std::fmt::Display>(what: &str, rows: Result<Vec<R>, E>) -> ExitCode {
    match rows {
        Ok(rows) => {
            for r in &rows {
                println!("{r}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gatehouse bench {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one benchmark, printing its results on standard output and its
/// progress on standard error.
pub fn run(what: Bench) -> ExitCode {
    match what {
        Bench::WgCrypto { seconds, sizes, batches } => {
            let time = std::time::Duration::from_secs_f64(seconds.max(0.05));
            eprintln!(
                "gatehouse bench wg-crypto: {seconds}s per case, one thread; engine mb: {}",
                gatehouse_mbx::aead::engine()
            );
            let rows = crate::wg_crypto::run(time, &sizes, &batches, |r| {
                let gbps = r.pps * r.size as f64 * 8.0 / 1e9;
                eprintln!(
                    "  {:>6} size {:>5} batch {:>3}: {:>12.0} packets/s {:>7.2} Gbit/s",
                    r.engine, r.size, r.batch, r.pps, gbps
                )
            });
            print_rows("wg-crypto", rows)
        }
        Bench::WgRouter { seconds, sizes, peers, vector } => {
            if let Some(bad) = sizes.iter().find(|s| !(60..=1434).contains(*s)) {
                eprintln!(
                    "gatehouse bench wg-router: --sizes {bad}: expected 60 to 1434 (a frame within the tunnel's 1420-byte MTU)"
                );
                return ExitCode::FAILURE;
            }
            let time = std::time::Duration::from_secs_f64(seconds.max(0.05));
            eprintln!(
                "gatehouse bench wg-router: one core, in memory, {seconds}s per case, {vector} frames per vector; AEAD: {}",
                gatehouse_mbx::aead::engine()
            );
            let rows = crate::wg_router::run(time, &sizes, &peers, vector.clamp(1, 1024), |r| {
                eprintln!(
                    "  {} size {:>5} peers {:>5}: {:>10.0} packets/s {:>6.2} Gbit/s {:>6.0} cycles/packet",
                    r.dir,
                    r.size,
                    r.peers,
                    r.pps,
                    r.gbps(),
                    r.cycles
                )
            });
            print_rows("wg-router", rows)
        }
        Bench::Keyops { seconds, rsa } => {
            let time = std::time::Duration::from_secs_f64(seconds.max(0.1));
            eprintln!(
                "gatehouse bench keyops: {seconds}s per engine and key, one thread; AVX-512 IFMA {}",
                if gatehouse_mbx::available() { "present (mb measured)" } else { "absent (mb skipped)" }
            );
            let results = crate::keyops::run(time, &rsa, |r| {
                eprintln!("  {:>6} {:<10} {:>10.0} ops/s", r.engine, r.key, r.ops_per_sec)
            });
            for bits in &rsa {
                if let Some(b) = crate::keyops::break_even(&results, &format!("rsa{bits}")) {
                    eprintln!(
                        "  rsa{bits}: one mb batch of 8 costs {b:.2} boring operations (break-even {})",
                        b.ceil()
                    );
                }
            }
            if let Some(b) = crate::keyops::break_even(&results, "x25519") {
                eprintln!("  x25519: one mb batch of 8 costs {b:.2} boring shared secrets");
            }
            for r in &results {
                println!("{r}");
            }
            ExitCode::SUCCESS
        }
        Bench::Tls {
            url,
            connections,
            threads,
            duration,
            handshakes,
            tls,
            ciphers,
            groups,
            sigalgs,
            connect,
            timeout,
        } => {
            let opts = crate::tls::Options {
                url,
                connections,
                threads,
                duration: std::time::Duration::from_secs_f64(duration.max(0.0)),
                handshakes,
                tls,
                ciphers,
                groups,
                sigalgs,
                connect,
                timeout: std::time::Duration::from_secs_f64(timeout.max(0.001)),
            };
            match crate::tls::run(&opts, |line| eprintln!("{line}")) {
                Ok(r) => {
                    eprintln!(
                        "  {} handshakes in {:.2}s, {} errors; negotiated {}",
                        r.handshakes,
                        r.elapsed.as_secs_f64(),
                        r.errors,
                        r.negotiated.as_deref().unwrap_or("nothing")
                    );
                    eprintln!(
                        "  handshake latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}; to the end of the response: p50 {:.3}  p99 {:.3}",
                        r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms, r.total_p50_ms, r.total_p99_ms
                    );
                    if let Some(cpu) = r.client_cpu_us {
                        eprintln!("  client CPU per handshake: {cpu:.1} µs (user + system, all client threads)");
                    }
                    for line in &r.error_lines {
                        eprintln!("  error {line}");
                    }
                    println!("{r}");
                    if r.errors > 0 || r.handshakes == 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
                }
                Err(e) => {
                    eprintln!("gatehouse bench tls: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Bench::L4 { syn_flood: true, seconds, .. } => {
            let (rate, left) = crate::l4::syn_flood(std::time::Duration::from_secs_f64(seconds.max(0.05)));
            println!("l4-synflood cookies_per_sec={rate:.0} sessions={left}");
            if left == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Bench::L4 { seconds, sessions, modes, protos, in_process, sync, sync_on, .. } => {
            use gatehouse_config::L4Mode;
            let mut cases = Vec::new();
            for m in &modes {
                let mode = match m.as_str() {
                    "nat" => L4Mode::Nat,
                    "fnat" => L4Mode::Fnat,
                    "dr" => L4Mode::Dr,
                    "ipip" => L4Mode::Ipip,
                    "gue" => L4Mode::Gue,
                    other => {
                        eprintln!("gatehouse bench l4: --modes {other}: expected nat, fnat, dr, ipip or gue");
                        return ExitCode::FAILURE;
                    }
                };
                for p in &protos {
                    let proto = match p.as_str() {
                        "tcp" => 6,
                        "udp" => 17,
                        other => {
                            eprintln!("gatehouse bench l4: --protos {other}: expected tcp or udp");
                            return ExitCode::FAILURE;
                        }
                    };
                    for &n in &sessions {
                        let variants = match (sync, sync_on) {
                            (_, true) => &[true][..],
                            (true, false) => &[false, true][..],
                            (false, false) => &[false][..],
                        };
                        for sync in variants {
                            cases.push(crate::l4::Case { mode, proto, sessions: n.max(1), sync: *sync });
                        }
                    }
                }
            }
            if !in_process {
                eprintln!(
                    "gatehouse bench l4: one core, in-memory generator, 64-byte frames, {seconds}s of established traffic per case"
                );
            }
            if !in_process && cases.len() > 1 {
                // One fresh process per case.
                let Ok(me) = std::env::current_exe() else { return ExitCode::FAILURE };
                let mut failed = false;
                for case in &cases {
                    let status = std::process::Command::new(&me)
                        .args(["bench", "l4", "--in-process", "--seconds", &seconds.to_string()])
                        .args(["--sessions", &case.sessions.to_string()])
                        .args(["--modes", crate::l4::mode_name(case.mode)])
                        .args(["--protos", if case.proto == 6 { "tcp" } else { "udp" }])
                        .args(if case.sync { &["--sync-on"][..] } else { &[][..] })
                        .status();
                    failed |= !status.is_ok_and(|s| s.success());
                }
                if sync {
                    for &n in &sessions {
                        println!("{} sessions={n}", crate::l4::sync_channel(n.max(1)));
                    }
                }
                return if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS };
            }
            let time = std::time::Duration::from_secs_f64(seconds.max(0.05));
            let mut failed = false;
            for case in &cases {
                let r = crate::l4::run(case, time);
                if r.not_forwarded > 0 {
                    eprintln!("  {} frames were not forwarded", r.not_forwarded);
                    failed = true;
                }
                println!("{r}");
            }
            if sync && !in_process {
                for &n in &sessions {
                    println!("{} sessions={n}", crate::l4::sync_channel(n.max(1)));
                }
            }
            if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Bench::L4Wire { interface, via, dst_mac, src, dst, proto, flows, seconds, pps } => {
            let via = match via.as_str() {
                "xdp" => crate::l4_wire::Via::Xdp,
                "af_xdp" => crate::l4_wire::Via::AfXdp,
                other => {
                    eprintln!("gatehouse bench l4-wire: --via {other}: expected xdp or af_xdp");
                    return ExitCode::FAILURE;
                }
            };
            let Some(dst_mac) = gatehouse_l4_io::runtime::parse_mac(&dst_mac) else {
                eprintln!(
                    "gatehouse bench l4-wire: --dst-mac {dst_mac}: expected six hex bytes like 02:00:0a:ff:00:01"
                );
                return ExitCode::FAILURE;
            };
            let proto = match proto.as_str() {
                "udp" => gatehouse_wire::packet::PROTO_UDP,
                "tcp" => gatehouse_wire::packet::PROTO_TCP,
                other => {
                    eprintln!("gatehouse bench l4-wire: --proto {other}: expected tcp or udp");
                    return ExitCode::FAILURE;
                }
            };
            let o = crate::l4_wire::WireOptions {
                via,
                interface,
                dst_mac,
                src,
                dst,
                proto,
                flows,
                duration: std::time::Duration::from_secs_f64(seconds.max(0.0)),
                pps,
            };
            match crate::l4_wire::generate(&o) {
                Ok(r) => {
                    println!("{r}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gatehouse bench l4-wire: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
