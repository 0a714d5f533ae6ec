//! The per-worker batcher: thread-local queues of RSA private operations, one
//! per key size, and of X25519 key shares, and a pool of ECDSA P-256
//! presignatures, with no locks.
//!
//! A queue runs as a batch when it holds [`mbx::BATCH`] operations (at once, in
//! the handshake that filled it), when the worker has no other ready work (the
//! runtime's park hook calls [`on_idle`], so a lone handshake never waits for a
//! timer), or when its oldest operation has waited `max_delay` while the worker
//! stayed busy ([`run_timer`]). A batch smaller than the key size's break-even
//! count runs one operation at a time in BoringSSL instead. A key share is
//! two X25519 operations on one scalar, the server's public key and the
//! shared secret; eight shares fill a batch. Up to four run both halves in
//! one batch of the ladder's lanes (two lanes each); more make their public
//! keys by the fixed-base comb (0.4 of a ladder batch: `gatehouse bench
//! keyops`) and their secrets in one ladder batch, so eight shares cost
//! 1.4 ladder batches instead of two. Even one share alone costs less in
//! lanes than in BoringSSL ([`SHARE_BREAK_EVEN`]). An idle worker runs four
//! shares or more at once, patient or not: eight gather only on a worker
//! too busy to idle between them, so the comb saves CPU under load and
//! costs no handshake a wait.
//!
//! Key shares are *patient* while waiting pays: an idle worker then
//! leaves a partial queue for the next arrivals to fill (the timer still
//! bounds the wait at `max_delay`), as Intel's QAT_SW and Envoy's CryptoMb
//! wait for full batches. The queue turns patient when a batch of it
//! fills, or when company is around: enough TLS handshakes under way on
//! the worker ([`handshake_begins`], `COMPANY`) and the previous arrival
//! within `max_delay`. Two waits in a row that end with too few to pay
//! (`PAID`) turn it impatient for a number of arrivals that doubles with
//! each such back-off. A client or a few making handshakes one after
//! another never wait. Under client-bound loads on one Zen 5 worker, this
//! took 11–20% off the CPU of a full handshake (docs/BENCHMARKS.md).
//!
//! ECDSA signatures wait for nothing. Most of a signature's work is its
//! nonce's (k·G, r and k⁻¹), which needs neither key nor message, so the
//! worker makes nonces ahead in full lane batches into a small pool of
//! presignatures, refilled when it runs low at an idle moment (rows of
//! eight that share their inversions, [`mbx::p256::presign_rows`]), or
//! eight at once by the signature that finds it empty. A signature takes one presignature (each signs once and
//! is zeroed on drop) and finishes in a fraction of a microsecond, in the
//! handshake that asked for it: no queue, no wait for company, no lone
//! signature in BoringSSL; every batch of nonces fills its lanes. TLS 1.2
//! ECDHE key pairs over X25519 are made ahead the same way, eight at a
//! time by the fixed-base comb ([`ecdhe_pair`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gatehouse_mbx as mbx;
use tokio::sync::{Notify, oneshot};

use zeroize::Zeroizing;

use crate::{Error, RsaKey, stats};

/// Settings shared by every worker, fixed at start-up.
static MAX_DELAY_US: AtomicU64 = AtomicU64::new(1000);

/// Sets the longest wait of a queued operation on a busy worker.
pub fn set_max_delay(d: Duration) {
    MAX_DELAY_US.store(d.as_micros().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
}

fn max_delay() -> Duration {
    Duration::from_micros(MAX_DELAY_US.load(Ordering::Relaxed))
}

/// Smallest batch for which the multi-buffer engine beats running the same
/// operations one by one in BoringSSL, per key size. From `gatehouse bench
/// keyops` on the development machine (AMD EPYC, Zen 4): one eight-lane batch
/// costs as much as 2.78 (RSA-2048), 2.71 (3072) and 3.15 (4096) BoringSSL
/// operations; see docs/BENCHMARKS.md.
pub fn break_even(class: mbx::KeyClass) -> usize {
    match class {
        mbx::KeyClass::Rsa2048 => 3,
        mbx::KeyClass::Rsa3072 => 3,
        mbx::KeyClass::Rsa4096 => 4,
    }
}

struct Pending {
    key: Arc<RsaKey>,
    input: Vec<u8>,
    queued: Instant,
    reply: oneshot::Sender<Result<Vec<u8>, Error>>,
}

/// Key shares from which the lanes beat BoringSSL. One batch of eight lanes
/// costs 1.41 BoringSSL X25519 shared secrets on Zen 5 (`gatehouse bench
/// keyops`), while one share in BoringSSL costs a key generation and a
/// shared secret (1.63 shared secrets): a lone share already gains.
pub const SHARE_BREAK_EVEN: usize = 1;

/// An X25519 key share computed in lanes: the server's public key and the
/// secret shared with the client; for X25519MLKEM768, the ML-KEM-768
/// ciphertext and secret too.
pub struct X25519Share {
    pub public: [u8; 32],
    pub secret: Zeroizing<[u8; 32]>,
    pub mlkem: Option<MlKemShare>,
}

/// An ML-KEM-768 encapsulation to the client's key.
pub struct MlKemShare {
    pub ciphertext: Box<[u8; mbx::mlkem::CIPHERTEXT_BYTES]>,
    pub secret: Zeroizing<[u8; 32]>,
}

struct SharePending {
    scalar: Zeroizing<[u8; 32]>,
    peer: [u8; 32],
    /// The client's ML-KEM-768 key (the batch checks it).
    mlkem: Option<Box<[u8]>>,
    queued: Instant,
    reply: oneshot::Sender<Result<X25519Share, Error>>,
}

/// An idle worker that signs (or answers TLS 1.2 ECDHE) makes more
/// presignatures (rows of eight) or X25519 key pairs (a batch of eight)
/// when it holds no more than this, so a burst finds them made.
const POOL_LOW: usize = mbx::BATCH;

/// Work made ahead in full batches (ECDSA presignatures, TLS 1.2 X25519
/// key pairs), oldest first, each taken once; a worker keeps it only once
/// it has used it.
struct Pool<T> {
    ready: VecDeque<T>,
    used: bool,
}

impl<T> Pool<T> {
    const fn new() -> Self {
        Pool { ready: VecDeque::new(), used: false }
    }

    /// Whether an idle worker should make another batch.
    fn low(&self) -> bool {
        self.used && self.ready.len() <= POOL_LOW
    }
}

/// The oldest item of this worker's pool `pool`, made first by `make` (a
/// batch into the pool) if none is left.
fn take<T>(pool: fn(&mut Batcher) -> &mut Pool<T>, make: fn()) -> Option<T> {
    let ready = BATCHER.with_borrow_mut(|b| {
        let p = pool(b);
        p.used = true;
        p.ready.pop_front()
    });
    ready.or_else(|| {
        make();
        BATCHER.with_borrow_mut(|b| pool(b).ready.pop_front())
    })
}

/// Shares that fill a batch.
const FULL: usize = mbx::BATCH;
/// A patient queue leaves an idle worker its shares for company only
/// while it holds fewer than this: four shares already fill one batch of
/// the ladder's lanes; more save only the comb's part, not worth holding
/// handshakes for the timer.
const WAITS_BELOW: usize = mbx::BATCH / 2;
/// Fewer than this in the queue after a wait: waiting did not pay. Two
/// shares already share one ladder batch (a lone share takes one too).
const PAID: usize = 2;
/// Handshakes under way on the worker from which the queue may wait for
/// company: eight (the two batches' worth of when four filled one). With
/// fewer, a few clients making handshakes in a loop wait for each other:
/// four clients waiting from one batch's worth lost 30% in median latency
/// and 12% in handshakes/s for 12% less CPU (Zen 5).
const COMPANY: usize = mbx::BATCH;
/// Arrivals a queue stays impatient after a wait that did not pay: the
/// first time, and at most.
const BACKOFF_MIN: u32 = 8;
const BACKOFF_MAX: u32 = 1024;

/// A TLS handshake under way on this worker, until dropped: what tells the
/// batcher that company for a queued share may come.
pub struct Handshake(());

/// Counts a handshake under way on this worker until the guard drops.
pub fn handshake_begins() -> Handshake {
    BATCHER.with_borrow_mut(|b| b.handshakes += 1);
    Handshake(())
}

impl Drop for Handshake {
    fn drop(&mut self) {
        // try_with: a task dropped while its thread ends finds no batcher.
        let _ = BATCHER.try_with(|b| {
            let mut b = b.borrow_mut();
            b.handshakes = b.handshakes.saturating_sub(1);
        });
    }
}

struct Batcher {
    /// One queue per key size, in [`mbx::KeyClass::ALL`] order.
    queues: [Vec<Pending>; 3],
    /// X25519 key shares, two lanes each.
    shares: Vec<SharePending>,
    /// Key shares asked for since the worker last went idle, and in the
    /// busy stretch before that: whether a new one waits for company or
    /// runs at once.
    this_tick: u32,
    last_tick: u32,
    /// Whether an idle worker leaves a partial queue of shares to fill
    /// (see the module's notes).
    patient: bool,
    /// When the last share was asked for.
    last_arrival: Option<Instant>,
    /// Arrivals that may not make the queue patient again after a wait
    /// that brought too little company, and how many the next such wait
    /// costs (doubling from [`BACKOFF_MIN`]; a full batch clears it).
    backoff: u32,
    penalty: u32,
    /// Whether the last wait judged came out with less than half a batch.
    empty_wait: bool,
    /// TLS handshakes under way on this worker ([`handshake_begins`]).
    handshakes: u32,
    /// ECDSA presignatures, and X25519 key pairs for TLS 1.2 ECDHE.
    presigned: Pool<mbx::p256::Presignature>,
    ecdhe: Pool<EcdhePair>,
    timer: Arc<Notify>,
}

thread_local! {
    static BATCHER: RefCell<Batcher> = RefCell::new(Batcher {
        queues: Default::default(),
        shares: Vec::new(),
        this_tick: 0,
        last_tick: 0,
        patient: false,
        last_arrival: None,
        backoff: 0,
        penalty: 0,
        empty_wait: false,
        handshakes: 0,
        presigned: Pool::new(),
        ecdhe: Pool::new(),
        timer: Arc::new(Notify::new()),
    });
}

impl Batcher {
    /// Notes a share's arrival at `now`: the queue turns patient when
    /// company is around — enough handshakes under way on the worker to
    /// fill two batches ([`COMPANY`]), and the previous arrival less than `max_delay`
    /// ago — unless a recent wait came out nearly empty ([`Self::waited`]).
    /// A client or two making handshakes one after another never wait.
    fn arrives(&mut self, now: Instant) {
        let recent = self.last_arrival.is_some_and(|t| now.saturating_duration_since(t) < max_delay());
        self.last_arrival = Some(now);
        if self.backoff > 0 {
            self.backoff -= 1;
        } else if recent && self.handshakes as usize >= COMPANY {
            self.patient = true;
        }
    }

    /// A patient queue waited `max_delay` and holds `n`: with fewer than
    /// [`PAID`], waiting did not pay. The second such wait
    /// with no batch that paid in between stops the queue being patient
    /// for a number of arrivals that doubles with each such back-off. One
    /// empty wait alone is no sign: under steady arrivals a few per
    /// `max_delay`, one wait in ten or so comes out empty by chance, and
    /// backing off on it ran one X25519MLKEM768 share in seven alone.
    fn waited(&mut self, n: usize) {
        if !self.patient {
            return;
        }
        let empty = n < PAID;
        if !(empty && self.empty_wait) {
            // A wait that paid, or the first empty one: patience holds.
            self.empty_wait = empty;
            return;
        }
        self.patient = false;
        self.empty_wait = false;
        self.penalty = (2 * self.penalty).clamp(BACKOFF_MIN, BACKOFF_MAX);
        self.backoff = self.penalty;
    }

    /// A batch filled: waiting pays.
    fn filled(&mut self) {
        self.patient = true;
        self.empty_wait = false;
        self.penalty = 0;
    }

    /// Counts one more share in this busy stretch; true when this stretch
    /// or the last asked for at least `enough` of them.
    fn busy(&mut self, enough: usize) -> bool {
        self.this_tick += 1;
        self.last_tick.max(self.this_tick) as usize >= enough
    }

    /// When the oldest queued operation was queued (each queue is in order).
    fn oldest(&self) -> Option<Instant> {
        let heads = self.queues.iter().filter_map(|q| q.first().map(|p| p.queued));
        heads.chain(self.shares.first().map(|p| p.queued)).min()
    }

    fn is_empty(&self) -> bool {
        self.queues.iter().all(Vec::is_empty) && self.shares.is_empty()
    }
}

/// Queues a raw private operation for a key of `class` (which must have a
/// multi-buffer form) on this worker; the receiver gets the result.
pub(crate) fn submit(
    class: mbx::KeyClass,
    key: Arc<RsaKey>,
    input: Vec<u8>,
) -> oneshot::Receiver<Result<Vec<u8>, Error>> {
    let (reply, rx) = oneshot::channel();
    let full = BATCHER.with_borrow_mut(|b| {
        if b.is_empty() {
            b.timer.notify_one();
        }
        let q = &mut b.queues[class.index()];
        q.push(Pending { key, input, queued: Instant::now(), reply });
        (q.len() >= mbx::BATCH).then(|| std::mem::take(q))
    });
    if let Some(ops) = full {
        run(class, ops);
    }
    rx
}

/// Queues an X25519 key share against the client's public key `peer`, with
/// a fresh scalar from BoringSSL's generator; the receiver gets the server's
/// public key and the shared secret. With `mlkem`, the client's ML-KEM-768
/// key, the batch encapsulates to it too (or fails the share if the key
/// is not one). Only on a CPU with IFMA.
pub fn submit_share(peer: [u8; 32], mlkem: Option<Box<[u8]>>) -> oneshot::Receiver<Result<X25519Share, Error>> {
    let (reply, rx) = oneshot::channel();
    let mut scalar = Zeroizing::new([0u8; 32]);
    if boring::rand::rand_bytes(&mut scalar[..]).is_err() {
        let _ = reply.send(Err(Error::Crypto("rand")));
        return rx;
    }
    let full = BATCHER.with_borrow_mut(|b| {
        let now = Instant::now();
        b.arrives(now);
        let pending = SharePending { scalar, peer, mlkem, queued: now, reply };
        // A quiet worker (no second share in this busy stretch or the last)
        // computes the share at once: waiting for company that is not coming
        // costs the handshake a round trip through the scheduler.
        let busy = b.busy(2);
        if b.shares.is_empty() && !busy && !b.patient {
            return Some(vec![pending]);
        }
        if b.is_empty() {
            b.timer.notify_one();
        }
        b.shares.push(pending);
        let full = b.shares.len() >= FULL;
        if full {
            b.filled();
        }
        full.then(|| std::mem::take(&mut b.shares))
    });
    if let Some(ops) = full {
        run_shares(ops);
    }
    rx
}

/// Signs a SHA-256 `digest` with `key` from one of this worker's
/// presignatures, made first if none is left; the signature DER-encoded.
/// A lane that fails its checks fails this signature alone.
pub(crate) fn sign(key: &mbx::p256::P256Key, digest: &[u8; 32]) -> Result<Vec<u8>, Error> {
    let presignature = take(|b| &mut b.presigned, presign).ok_or(Error::Fault)?;
    let mut out = [0u8; 64];
    let fault = injected_fault().map(|f| mbx::p256::FinishFault { lane: f.lane });
    let mut op = [mbx::p256::FinishOp { presignature, key, digest, out: &mut out }];
    match mbx::p256::finish_batch(&mut op, fault)[0] {
        Ok(()) => crate::ecdsa_der(&out),
        Err(_) => {
            stats::record_fault();
            tracing::error!("ECDSA lane failed its checks; handshake aborted");
            Err(Error::Fault)
        }
    }
}

/// Makes one row of eight presignatures into this worker's pool: what a
/// signature that finds the pool empty waits for.
fn presign() {
    presign_rows(1);
}

/// Makes `rows` rows of eight presignatures into this worker's pool, each
/// counted as a batch of eight ECDSA lanes. A lane whose checks fail is
/// counted as a fault and left out.
fn presign_rows(rows: usize) {
    let made = mbx::p256::presign_rows(rows);
    for _ in 0..rows {
        stats::record_batch_of(stats::ECDSA_P256, mbx::BATCH, true);
    }
    let sound: Vec<_> = made.into_iter().filter_map(Result::ok).collect();
    let failed = rows * mbx::BATCH - sound.len();
    for _ in 0..failed {
        stats::record_fault();
    }
    if failed > 0 {
        tracing::error!(failed, "ECDSA nonces failed their checks (or the generator failed); left out");
    }
    BATCHER.with_borrow_mut(|b| b.presigned.ready.extend(sound));
}

/// An X25519 key pair for a TLS 1.2 ECDHE handshake: the private scalar as
/// BoringSSL keeps it (32 random bytes, clamped when used) and its public
/// key. Used once; the scalar is zeroed on drop.
pub struct EcdhePair {
    pub public: [u8; 32],
    pub private: Zeroizing<[u8; 32]>,
}

/// One of this worker's X25519 key pairs made ahead, made first (eight
/// at once) if none is left; `None` if the generator or every lane failed.
/// Only on a CPU with IFMA.
pub fn ecdhe_pair() -> Option<EcdhePair> {
    take(|b| &mut b.ecdhe, make_ecdhe_pairs)
}

/// Makes eight X25519 key pairs by the fixed-base comb into this worker's
/// pool, counted as a batch of eight X25519 operations. A lane whose public
/// key fails its check is counted as a fault and left out.
fn make_ecdhe_pairs() {
    let mut scalars = Zeroizing::new([[0u8; 32]; mbx::BATCH]);
    if scalars.iter_mut().any(|k| boring::rand::rand_bytes(k).is_err()) {
        stats::record_fault();
        tracing::error!("the generator failed: no ECDHE key pairs made");
        return;
    }
    let mut publics = [[0u8; 32]; mbx::BATCH];
    let results = {
        let mut ops: Vec<mbx::x25519::KeygenOp<'_>> =
            scalars.iter().zip(publics.iter_mut()).map(|(scalar, out)| mbx::x25519::KeygenOp { scalar, out }).collect();
        mbx::x25519::public_batch(&mut ops)
    };
    stats::record_batch_of(stats::X25519, mbx::BATCH, true);
    let mut made = Vec::with_capacity(mbx::BATCH);
    for ((scalar, public), result) in scalars.iter().zip(publics).zip(results) {
        match result {
            Ok(()) => made.push(EcdhePair { public, private: Zeroizing::new(*scalar) }),
            Err(_) => {
                stats::record_fault();
                tracing::error!("an X25519 public key failed its check; left out");
            }
        }
    }
    BATCHER.with_borrow_mut(|b| b.ecdhe.ready.extend(made));
}

/// Runs what is queued on this worker when it is about to park (no other
/// ready work; the runtime's park hook), so the common case, nothing
/// queued, is one check. A patient queue of shares or signatures is left
/// for the next arrivals to fill; the timer bounds its wait.
pub fn on_idle() {
    flush(false);
}

/// Runs the queues: on an idle worker, all but a patient queue of shares,
/// and a batch of presignatures if the worker signs and holds few; for
/// the timer (`timer`), all but a patient queue of shares whose oldest
/// has not yet waited `max_delay` ([`Batcher::waited`] judges one that did).
fn flush(timer: bool) {
    let (queued, (presign_now, pairs_now)) = BATCHER.with_borrow_mut(|b| {
        if b.this_tick != 0 || b.last_tick != 0 {
            b.last_tick = std::mem::take(&mut b.this_tick);
        }
        let presign_now = !timer && b.presigned.low();
        let pairs_now = !timer && b.ecdhe.low();
        if b.is_empty() {
            return (None, (presign_now, pairs_now));
        }
        // The clock only for the timer: an idle worker parks often.
        let now = timer.then(Instant::now);
        let head = b.shares.first().map(|p| p.queued);
        let due = now.zip(head).is_some_and(|(now, t)| now.saturating_duration_since(t) >= max_delay());
        let length = b.shares.len();
        if due {
            b.waited(length);
        }
        let run = !(b.patient && !due && length < WAITS_BELOW);
        // A batch that fills the lanes it takes paid for its wait.
        if run && length >= WAITS_BELOW {
            b.filled();
        }
        let shares = if run { std::mem::take(&mut b.shares) } else { Vec::new() };
        (Some((b.queues.each_mut().map(std::mem::take), shares)), (presign_now, pairs_now))
    });
    if let Some((queued, shares)) = queued {
        for (class, ops) in mbx::KeyClass::ALL.into_iter().zip(queued) {
            if !ops.is_empty() {
                run(class, ops);
            }
        }
        if !shares.is_empty() {
            run_shares(shares);
        }
    }
    if presign_now {
        // At an idle moment, rows that share their inversions.
        presign_rows(mbx::p256::POOL_ROWS);
    }
    if pairs_now {
        make_ecdhe_pairs();
    }
}

/// The bound on every wait: a task on each worker that runs the queues once
/// the oldest queued operation has waited `max_delay` (while the worker
/// stayed busy, or while a patient queue waited for company). Spawn it once
/// per worker.
pub async fn run_timer() {
    let notify = BATCHER.with_borrow(|b| b.timer.clone());
    loop {
        notify.notified().await;
        // Until the queues are empty: each sleep ends when the oldest
        // operation queued now has waited `max_delay`.
        while let Some(oldest) = BATCHER.with_borrow(Batcher::oldest) {
            let due = oldest + max_delay();
            if Instant::now() < due {
                tokio::time::sleep_until(due.into()).await;
            } else {
                stats::record_timer_flush();
                flush(true);
            }
        }
    }
}

/// Fault injection for the end-to-end test of the public-key check:
/// `GATEHOUSE_TEST_FAULT_LANE=N` corrupts lane N of every RSA batch, and
/// every ECDSA signature whose nonce came from lane N of its batch.
fn injected_fault() -> Option<mbx::Fault> {
    static LANE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let lane = (*LANE.get_or_init(|| test_hook("GATEHOUSE_TEST_FAULT_LANE", "lane {} of every RSA and ECDSA batch")))?;
    Some(mbx::Fault { lane, limb: 3 })
}

/// `GATEHOUSE_TEST_FAULT_SHARE=N` corrupts the secret of the N-th key
/// share of every X25519 batch, to show that only its handshake fails.
fn injected_share_fault() -> Option<usize> {
    static SHARE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *SHARE.get_or_init(|| test_hook("GATEHOUSE_TEST_FAULT_SHARE", "key share {} of every X25519 batch"))
}

fn test_hook(var: &str, what: &str) -> Option<usize> {
    let n: usize = std::env::var(var).ok()?.parse().ok()?;
    tracing::warn!("fault injection on ({var}): {} will be corrupted", what.replace("{}", &n.to_string()));
    Some(n)
}

/// Computes queued key shares (up to [`mbx::BATCH`]) in lanes: for each, its
/// public key (the scalar times the base point) and its shared secret. A
/// share whose secret comes out zero (the client's point has small order)
/// fails with [`Error::LowOrder`]; the handshake then leaves the share to
/// BoringSSL, which refuses the point as it should. A public key that
/// fails its check fails its share with [`Error::Fault`].
fn run_shares(ops: Vec<SharePending>) {
    let now = Instant::now();
    for op in &ops {
        stats::record_queue_delay(now.saturating_duration_since(op.queued));
    }
    stats::record_batch_of(stats::X25519, 2 * ops.len(), true);
    let mut publics = [[0u8; 32]; mbx::BATCH];
    let mut secrets = Zeroizing::new([[0u8; 32]; mbx::BATCH]);
    let results = x25519_halves(&ops, &mut publics, &mut secrets);
    if let Some(i) = injected_share_fault()
        && let Some(secret) = secrets.get_mut(i)
    {
        secret[0] ^= 1; // a wrong secret: only that client's Finished fails
    }
    let mut mlkem = encapsulate(&ops).into_iter();
    for (i, op) in ops.into_iter().enumerate() {
        let kem = if op.mlkem.is_some() { mlkem.next() } else { None };
        let sent = match (results[i], kem.transpose()) {
            (Ok(()), Ok(mlkem)) => Ok(X25519Share { public: publics[i], secret: Zeroizing::new(secrets[i]), mlkem }),
            (Err(e), _) => Err(e.into()),
            (_, Err(e)) => Err(e),
        };
        let _ = op.reply.send(sent);
    }
}

/// Why a share's X25519 half failed.
#[derive(Clone, Copy)]
enum Half {
    /// The public key failed its check (the base point has no small order).
    Public,
    /// The shared secret is zero: the client's point has small order.
    Secret,
}

impl From<Half> for Error {
    fn from(h: Half) -> Error {
        match h {
            Half::Public => Error::Fault,
            Half::Secret => Error::LowOrder,
        }
    }
}

/// Each share's public key and shared secret, and per share whether both
/// came out sound. Four shares or fewer take two lanes each of one ladder
/// batch; more take the comb for their public keys and one ladder batch
/// for their secrets.
fn x25519_halves(
    ops: &[SharePending],
    publics: &mut [[u8; 32]; mbx::BATCH],
    secrets: &mut [[u8; 32]; mbx::BATCH],
) -> [Result<(), Half>; mbx::BATCH] {
    let verdict = |public: bool, secret: bool| match (public, secret) {
        (true, true) => Ok(()),
        (false, _) => Err(Half::Public),
        (true, false) => Err(Half::Secret),
    };
    let mut out = [Ok(()); mbx::BATCH];
    if 2 * ops.len() <= mbx::BATCH {
        let mut lanes: Vec<mbx::x25519::X25519Op<'_>> = Vec::with_capacity(mbx::BATCH);
        for ((op, public), secret) in ops.iter().zip(publics.iter_mut()).zip(secrets.iter_mut()) {
            lanes.push(mbx::x25519::X25519Op { scalar: &op.scalar, point: &mbx::x25519::BASE, out: public });
            lanes.push(mbx::x25519::X25519Op { scalar: &op.scalar, point: &op.peer, out: secret });
        }
        let r = mbx::x25519::x25519_batch(&mut lanes);
        for (i, o) in out.iter_mut().enumerate().take(ops.len()) {
            *o = verdict(r[2 * i].is_ok(), r[2 * i + 1].is_ok());
        }
        return out;
    }
    let mut keys: Vec<mbx::x25519::KeygenOp<'_>> =
        ops.iter().zip(publics.iter_mut()).map(|(op, out)| mbx::x25519::KeygenOp { scalar: &op.scalar, out }).collect();
    let keys = mbx::x25519::public_batch(&mut keys);
    let mut shared: Vec<mbx::x25519::X25519Op<'_>> = ops
        .iter()
        .zip(secrets.iter_mut())
        .map(|(op, out)| mbx::x25519::X25519Op { scalar: &op.scalar, point: &op.peer, out })
        .collect();
    let shared = mbx::x25519::x25519_batch(&mut shared);
    for (i, o) in out.iter_mut().enumerate().take(ops.len()) {
        *o = verdict(keys[i].is_ok(), shared[i].is_ok());
    }
    out
}

/// The ML-KEM-768 halves of a batch of shares, in order of the shares
/// that have one: encapsulations in Keccak lanes, each with 32 bytes from
/// BoringSSL's generator as FIPS 203's `m`.
fn encapsulate(ops: &[SharePending]) -> Vec<Result<MlKemShare, Error>> {
    let keys: Vec<&[u8]> = ops.iter().filter_map(|op| op.mlkem.as_deref()).collect();
    if keys.is_empty() {
        return Vec::new();
    }
    let mut entropy = Zeroizing::new(vec![[0u8; 32]; keys.len()]);
    if entropy.iter_mut().any(|m| boring::rand::rand_bytes(m).is_err()) {
        return keys.iter().map(|_| Err(Error::Crypto("rand"))).collect();
    }
    let mut out: Vec<MlKemShare> = keys
        .iter()
        .map(|_| MlKemShare {
            ciphertext: Box::new([0; mbx::mlkem::CIPHERTEXT_BYTES]),
            secret: Zeroizing::new([0; 32]),
        })
        .collect();
    let results = {
        let mut batch: Vec<mbx::mlkem::EncapOp<'_>> = keys
            .iter()
            .zip(entropy.iter())
            .zip(out.iter_mut())
            .map(|((key, m), o)| mbx::mlkem::EncapOp {
                public_key: key,
                entropy: m,
                ciphertext: &mut o.ciphertext,
                secret: &mut o.secret,
            })
            .collect();
        mbx::mlkem::encapsulate_batch(&mut batch)
    };
    stats::record_batch_of(stats::MLKEM768, keys.len(), true);
    out.into_iter().zip(results).map(|(o, r)| r.map(|()| o).map_err(|_| Error::Crypto("ML-KEM-768 key"))).collect()
}

fn run(class: mbx::KeyClass, ops: Vec<Pending>) {
    let now = Instant::now();
    for op in &ops {
        stats::record_queue_delay(now.saturating_duration_since(op.queued));
    }
    if ops.len() < break_even(class) {
        stats::record_batch(class, ops.len(), false);
        for op in ops {
            let result = op.key.private_single(&op.input);
            let _ = op.reply.send(result);
        }
        return;
    }
    stats::record_batch(class, ops.len(), true);
    let mut outputs: Vec<Vec<u8>> = ops.iter().map(|op| vec![0u8; op.key.size()]).collect();
    let results = {
        let mut batch: Vec<mbx::Op<'_>> = Vec::with_capacity(ops.len());
        for (op, out) in ops.iter().zip(outputs.iter_mut()) {
            match op.key.mb_key() {
                Some(key) => batch.push(mbx::Op { key, input: &op.input, output: out }),
                None => return, // unreachable: only keys with an mb form are queued
            }
        }
        mbx::private_batch_with_fault(&mut batch, injected_fault())
    };
    for ((op, out), result) in ops.into_iter().zip(outputs).zip(results) {
        let sent = match result {
            Ok(()) => Ok(out),
            Err(mbx::OpError::Fault) => {
                stats::record_fault();
                tracing::error!("RSA result failed the public-key check; handshake aborted");
                Err(Error::Fault)
            }
            Err(e) => Err(Error::Engine(e)),
        };
        let _ = op.reply.send(sent);
    }
}
