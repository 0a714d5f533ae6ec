//! `gatehouse bench tls`: a TLS handshake load generator.
//!
//! Each of N concurrent connections loops: TCP connect, a full TLS handshake
//! (the client keeps no session, so nothing is resumed), one HTTP/1.1 request
//! with `Connection: close`, the whole response, close. It measures what a
//! server spends on handshakes, so the client must spend little: BoringSSL with
//! no certificate verification, one key share (X25519 unless told otherwise;
//! P-256 is listed too, without a share, because TLS 1.2 lets a server use a
//! P-256 ECDSA certificate only with a client that lists the curve), one
//! current-thread runtime per client thread, one small buffer per
//! connection, and counters kept per connection task and merged at the end.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use boring::ssl::{Ssl, SslContext, SslMethod, SslOptions, SslSessionCacheMode, SslVerifyMode, SslVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{BenchError, failed};

/// What to run, from the command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// `https://host[:port][/path]`.
    pub url: String,
    /// Concurrent connections (spread over the threads).
    pub connections: usize,
    pub threads: usize,
    /// Stop starting connections after this long...
    pub duration: Duration,
    /// ...or after this many (whichever comes first).
    pub handshakes: Option<u64>,
    /// "1.2" or "1.3"; both allowed when absent.
    pub tls: Option<String>,
    /// TLS 1.2 cipher list (OpenSSL syntax).
    pub ciphers: Option<String>,
    /// Key-exchange groups offered, e.g. "X25519" or "P-256".
    pub groups: String,
    /// Signature algorithms offered, e.g. "rsa_pss_rsae_sha256".
    pub sigalgs: Option<String>,
    /// Connect here instead of the URL's host (SNI and Host still from the URL).
    pub connect: Option<SocketAddr>,
    /// Per connection, from connect to the end of the response.
    pub timeout: Duration,
}

/// Why a connection did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Connect,
    Handshake,
    Request,
    Status,
    Timeout,
}

const FAILURES: [(Failure, &str); 5] = [
    (Failure::Connect, "connect"),
    (Failure::Handshake, "handshake"),
    (Failure::Request, "request"),
    (Failure::Status, "status"),
    (Failure::Timeout, "timeout"),
];

/// What one connection task (and, merged, the whole run) measured.
#[derive(Default)]
struct Tally {
    /// Microseconds from the start of the TCP connect to the end of the handshake.
    handshake_us: Vec<u32>,
    /// Microseconds from the start of the TCP connect to the end of the response.
    total_us: Vec<u32>,
    errors: [u64; FAILURES.len()],
    /// One example message per failure kind, for the report.
    first_error: [Option<String>; FAILURES.len()],
    /// Negotiated version and cipher of the first completed handshake.
    negotiated: Option<String>,
}

impl Tally {
    fn fail(&mut self, kind: Failure, msg: String) {
        let i = FAILURES.iter().position(|(k, _)| *k == kind).unwrap_or(0);
        self.errors[i] += 1;
        if self.first_error[i].is_none() {
            self.first_error[i] = Some(msg);
        }
    }

    fn merge(&mut self, other: Tally) {
        self.handshake_us.extend(other.handshake_us);
        self.total_us.extend(other.total_us);
        for (i, n) in other.errors.iter().enumerate() {
            self.errors[i] += n;
        }
        for (mine, theirs) in self.first_error.iter_mut().zip(other.first_error) {
            if mine.is_none() {
                *mine = theirs;
            }
        }
        if self.negotiated.is_none() {
            self.negotiated = other.negotiated;
        }
    }
}

/// The result of a run.
pub struct Report {
    pub handshakes: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub handshakes_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub total_p50_ms: f64,
    pub total_p99_ms: f64,
    /// Client CPU (user + system, all threads) per completed handshake.
    pub client_cpu_us: Option<f64>,
    pub negotiated: Option<String>,
    pub error_lines: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tls handshakes_per_sec={:.0} p50_ms={:.3} p99_ms={:.3} errors={}",
            self.handshakes_per_sec, self.p50_ms, self.p99_ms, self.errors
        )
    }
}

/// The parsed target.
struct Target {
    host: String,
    addr: SocketAddr,
    request: Vec<u8>,
}

fn parse_target(opts: &Options) -> Result<Target, BenchError> {
    let rest = opts
        .url
        .strip_prefix("https://")
        .ok_or_else(|| BenchError::Invalid(format!("{}: expected a URL starting with https://", opts.url)))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(BenchError::Invalid(format!("{}: the URL has no host", opts.url)));
    }
    // host, host:port, [v6], [v6]:port
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) =
            v6.split_once(']').ok_or_else(|| BenchError::Invalid(format!("{}: unclosed '[' in the host", opts.url)))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse::<u16>().map_err(|_| BenchError::Invalid(format!("{}: bad port {p:?}", opts.url)))?,
            None if after.is_empty() => 443,
            None => return Err(BenchError::Invalid(format!("{}: unexpected {after:?} after the host", opts.url))),
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>().map_err(|_| BenchError::Invalid(format!("{}: bad port {p:?}", opts.url)))?,
            ),
            None => (authority.to_string(), 443),
        }
    };
    let addr = match opts.connect {
        Some(a) => a,
        None => {
            let candidates: Vec<SocketAddr> =
                (host.as_str(), port).to_socket_addrs().map_err(failed(format!("{host}: cannot resolve")))?.collect();
            // With several addresses (localhost: ::1 and 127.0.0.1), the first
            // that accepts a connection now is used for the run. One address
            // is not probed: the probe would count as a failed handshake on
            // the server.
            match candidates.as_slice() {
                [] => return Err(BenchError::Invalid(format!("{host}: resolves to no address"))),
                [one] => *one,
                _ => candidates
                    .iter()
                    .copied()
                    .find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok())
                    .ok_or_else(|| {
                        BenchError::Invalid(format!("{host}:{port}: no address accepts connections ({candidates:?})"))
                    })?,
            }
        }
    };
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: gatehouse-bench\r\nConnection: close\r\n\r\n");
    Ok(Target { host, addr, request: request.into_bytes() })
}

fn client_context(opts: &Options) -> Result<SslContext, BenchError> {
    let mut b = SslContext::builder(SslMethod::tls()).map_err(failed("TLS context"))?;
    // A load generator measures the server: the client checks nothing it can skip.
    b.set_verify(SslVerifyMode::NONE);
    // Every connection is a full handshake: no session cache, no tickets.
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_options(SslOptions::NO_TICKET);
    let version = match opts.tls.as_deref() {
        None => None,
        Some("1.2") => Some(SslVersion::TLS1_2),
        Some("1.3") => Some(SslVersion::TLS1_3),
        Some(v) => return Err(BenchError::Invalid(format!("--tls {v}: expected 1.2 or 1.3"))),
    };
    if version.is_some() {
        b.set_min_proto_version(version).map_err(failed("--tls"))?;
        b.set_max_proto_version(version).map_err(failed("--tls"))?;
    } else {
        b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(failed("--tls"))?;
    }
    if let Some(c) = &opts.ciphers {
        b.set_cipher_list(c).map_err(failed(format!("--ciphers {c}")))?;
    }
    b.set_curves_list(&opts.groups).map_err(failed(format!("--groups {}", opts.groups)))?;
    if let Some(s) = &opts.sigalgs {
        b.set_sigalgs_list(s).map_err(failed(format!("--sigalgs {s}")))?;
    }
    b.set_alpn_protos(b"\x08http/1.1").map_err(failed("ALPN"))?;
    Ok(b.build())
}

/// Ticks of user + system CPU this process has used, from /proc/self/stat.
fn process_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn ticks_per_second() -> f64 {
    // USER_HZ is 100 on every Linux architecture Gatehouse builds for.
    100.0
}

/// Shared among threads: how many connections may still start, and until when.
struct Budget {
    remaining: AtomicU64,
    deadline: Instant,
}

impl Budget {
    fn take(&self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        self.remaining.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

/// Runs the load and reports. `progress` gets human-readable lines.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Result<Report, BenchError> {
    if opts.connections == 0 || opts.threads == 0 {
        return Err(BenchError::Invalid("--connections and --threads must be at least 1".into()));
    }
    let target = Arc::new(parse_target(opts)?);
    let ctx = client_context(opts)?;
    let threads = opts.threads.min(opts.connections);
    progress(&format!(
        "gatehouse bench tls: {} ({}), {} connections on {} thread(s), {}{}",
        opts.url,
        target.addr,
        opts.connections,
        threads,
        match opts.handshakes {
            Some(n) => format!("{n} handshakes or "),
            None => String::new(),
        },
        format_args!("{:.1}s at most", opts.duration.as_secs_f64()),
    ));
    let start = Instant::now();
    let budget = Arc::new(Budget {
        remaining: AtomicU64::new(opts.handshakes.unwrap_or(u64::MAX)),
        deadline: start + opts.duration,
    });
    let cpu0 = process_cpu_ticks();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            // Connections spread as evenly as they go.
            let conns = opts.connections / threads + usize::from(t < opts.connections % threads);
            let (target, ctx, budget, timeout) = (target.clone(), ctx.clone(), budget.clone(), opts.timeout);
            std::thread::Builder::new()
                .name(format!("bench-tls-{t}"))
                .spawn(move || client_thread(conns, target, ctx, budget, timeout))
        })
        .collect();
    let mut tally = Tally::default();
    for w in workers {
        let handle = w.map_err(failed("cannot start a client thread"))?;
        tally.merge(handle.join().map_err(|_| BenchError::Invalid("a client thread panicked".into()))??);
    }
    let elapsed = start.elapsed();
    let cpu1 = process_cpu_ticks();
    Ok(report(tally, elapsed, cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a))))
}

fn client_thread(
    conns: usize,
    target: Arc<Target>,
    ctx: SslContext,
    budget: Arc<Budget>,
    timeout: Duration,
) -> Result<Tally, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failed("cannot build a client runtime"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let tasks: Vec<_> = (0..conns)
            .map(|_| tokio::task::spawn_local(connection_loop(target.clone(), ctx.clone(), budget.clone(), timeout)))
            .collect();
        let mut tally = Tally::default();
        for t in tasks {
            tally.merge(t.await.map_err(failed("a connection task failed"))?);
        }
        Ok(tally)
    })
}

async fn connection_loop(target: Arc<Target>, ctx: SslContext, budget: Arc<Budget>, timeout: Duration) -> Tally {
    let mut tally = Tally::default();
    let mut buf = vec![0u8; 16 * 1024];
    while budget.take() {
        let t0 = Instant::now();
        match tokio::time::timeout(timeout, one_connection(&target, &ctx, &mut buf, t0)).await {
            Ok(Ok((hs, total, negotiated))) => {
                tally.handshake_us.push(hs);
                tally.total_us.push(total);
                if tally.negotiated.is_none() {
                    tally.negotiated = Some(negotiated);
                }
            }
            Ok(Err((kind, msg))) => tally.fail(kind, msg),
            Err(_) => tally.fail(Failure::Timeout, format!("no complete response within {:?}", timeout)),
        }
    }
    tally
}

fn micros_since(t0: Instant) -> u32 {
    u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX)
}

/// One connection: connect, handshake, request, response, close.
/// Returns the handshake and total latencies and "version cipher".
async fn one_connection(
    target: &Target,
    ctx: &SslContext,
    buf: &mut [u8],
    t0: Instant,
) -> Result<(u32, u32, String), (Failure, String)> {
    let tcp = TcpStream::connect(target.addr).await.map_err(|e| {
        let hint = if e.raw_os_error() == Some(24) { " (raise the open-file limit: ulimit -n)" } else { "" };
        (Failure::Connect, format!("{}: {e}{hint}", target.addr))
    })?;
    let _ = tcp.set_nodelay(true);
    let mut ssl = Ssl::new(ctx).map_err(|e| (Failure::Handshake, e.to_string()))?;
    ssl.set_hostname(&target.host).map_err(|e| (Failure::Handshake, e.to_string()))?;
    let mut tls = tokio_boring::SslStreamBuilder::new(ssl, tcp)
        .connect()
        .await
        .map_err(|e| (Failure::Handshake, e.to_string()))?;
    let hs = micros_since(t0);
    let negotiated =
        format!("{} {}", tls.ssl().version_str(), tls.ssl().current_cipher().map(|c| c.name()).unwrap_or("?"));
    tls.write_all(&target.request).await.map_err(|e| (Failure::Request, format!("write: {e}")))?;
    read_response(&mut tls, buf).await?;
    Ok((hs, micros_since(t0), negotiated))
}

/// Reads one response to its end: a 2xx status, then Content-Length bytes,
/// the last chunk, or end of stream. Then drains to the server's close so the
/// server, not the client, closes first (no client TIME_WAIT build-up).
async fn read_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S, buf: &mut [u8]) -> Result<(), (Failure, String)> {
    let mut filled = 0;
    let (head_len, status, body) = loop {
        if filled == buf.len() {
            return Err((Failure::Request, format!("response head longer than {} bytes", buf.len())));
        }
        let n = s.read(&mut buf[filled..]).await.map_err(|e| (Failure::Request, format!("read: {e}")))?;
        if n == 0 {
            return Err((Failure::Request, "connection closed before a complete response head".into()));
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(len)) => {
                let status = resp.code.unwrap_or(0);
                let mut body = Body::ToEof;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        let n = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<u64>().ok());
                        body = Body::Length(n.ok_or_else(|| (Failure::Request, "bad Content-Length".to_string()))?);
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value.eq_ignore_ascii_case(b"chunked")
                    {
                        body = Body::Chunked;
                    }
                }
                break (len, status, body);
            }
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return Err((Failure::Request, format!("malformed response: {e}"))),
        }
    };
    if !(200..300).contains(&status) {
        return Err((Failure::Status, format!("status {status}")));
    }
    match body {
        Body::Length(len) => {
            let mut left = len.saturating_sub((filled - head_len) as u64);
            while left > 0 {
                let n = s.read(buf).await.map_err(|e| (Failure::Request, format!("read body: {e}")))?;
                if n == 0 {
                    return Err((
                        Failure::Request,
                        format!("connection closed {left} bytes before the end of the body"),
                    ));
                }
                left = left.saturating_sub(n as u64);
            }
        }
        Body::Chunked => {
            // The last chunk is "0\r\n\r\n" (no trailers from the servers measured).
            let mut tail = buf[head_len..filled].to_vec();
            while !tail.ends_with(b"0\r\n\r\n") {
                let n = s.read(buf).await.map_err(|e| (Failure::Request, format!("read body: {e}")))?;
                if n == 0 {
                    return Err((Failure::Request, "connection closed before the last chunk".into()));
                }
                tail.extend_from_slice(&buf[..n]);
                let keep = tail.len().saturating_sub(5);
                tail.drain(..keep);
            }
        }
        Body::ToEof => {}
    }
    // The response is complete; whatever follows (close_notify, FIN, or a reset
    // from a server that closed hard) no longer matters.
    loop {
        match s.read(buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
    }
}

enum Body {
    Length(u64),
    Chunked,
    ToEof,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

fn report(mut t: Tally, elapsed: Duration, cpu_ticks: Option<u64>) -> Report {
    t.handshake_us.sort_unstable();
    t.total_us.sort_unstable();
    let handshakes = t.handshake_us.len() as u64;
    let errors: u64 = t.errors.iter().sum();
    let error_lines = FAILURES
        .iter()
        .zip(t.errors.iter().zip(t.first_error.iter()))
        .filter(|(_, (n, _))| **n > 0)
        .map(|((_, name), (n, first))| format!("{name}: {n} (first: {})", first.as_deref().unwrap_or("?")))
        .collect();
    Report {
        handshakes,
        errors,
        elapsed,
        handshakes_per_sec: handshakes as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: percentile(&t.handshake_us, 0.50),
        p90_ms: percentile(&t.handshake_us, 0.90),
        p99_ms: percentile(&t.handshake_us, 0.99),
        max_ms: percentile(&t.handshake_us, 1.0),
        total_p50_ms: percentile(&t.total_us, 0.50),
        total_p99_ms: percentile(&t.total_us, 0.99),
        client_cpu_us: cpu_ticks
            .filter(|&ticks| handshakes > 0 && ticks > 0)
            .map(|ticks| ticks as f64 * 1e6 / ticks_per_second() / handshakes as f64),
        negotiated: t.negotiated,
        error_lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(url: &str) -> Options {
        Options {
            url: url.into(),
            connections: 1,
            threads: 1,
            duration: Duration::from_secs(1),
            handshakes: None,
            tls: None,
            ciphers: None,
            groups: "X25519".into(),
            sigalgs: None,
            connect: Some("127.0.0.1:1".parse().expect("literal")),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn urls() {
        let t = parse_target(&opts("https://example.com:8443/a/b?c")).expect("valid");
        assert_eq!(t.host, "example.com");
        assert!(String::from_utf8_lossy(&t.request).starts_with("GET /a/b?c HTTP/1.1\r\nHost: example.com:8443\r\n"));
        let t = parse_target(&opts("https://[::1]:9/")).expect("valid");
        assert_eq!(t.host, "::1");
        assert!(String::from_utf8_lossy(&t.request).contains("Host: [::1]:9\r\n"));
        let t = parse_target(&opts("https://localhost")).expect("valid");
        assert!(String::from_utf8_lossy(&t.request).starts_with("GET / HTTP/1.1\r\nHost: localhost\r\n"));
        assert!(parse_target(&opts("http://x/")).is_err());
        assert!(parse_target(&opts("https://x:99999/")).is_err());
        assert!(parse_target(&opts("https:///")).is_err());
    }

    #[test]
    fn bad_tls_options_are_refused() {
        let mut o = opts("https://x/");
        o.tls = Some("1.1".into());
        assert!(client_context(&o).expect_err("refused").to_string().contains("--tls 1.1"));
        let mut o = opts("https://x/");
        o.groups = "nonsense".into();
        assert!(client_context(&o).expect_err("refused").to_string().contains("--groups nonsense"));
    }

    #[test]
    fn responses_are_read_to_their_end() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut buf = vec![0u8; 64];
        let mut ok: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert!(rt.block_on(read_response(&mut ok, &mut buf)).is_ok());
        let mut chunked: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        assert!(rt.block_on(read_response(&mut chunked, &mut buf)).is_ok());
        let mut short: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello";
        assert_eq!(rt.block_on(read_response(&mut short, &mut buf)).expect_err("an error").0, Failure::Request);
        let mut status: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(rt.block_on(read_response(&mut status, &mut buf)).expect_err("an error").0, Failure::Status);
        let mut long = vec![b'x'; 100];
        long.splice(0..0, b"HTTP/1.1 200 OK\r\nX: ".iter().copied());
        assert_eq!(
            rt.block_on(read_response(&mut long.as_slice(), &mut buf)).expect_err("an error").0,
            Failure::Request
        );
    }

    #[test]
    fn percentiles() {
        let v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
