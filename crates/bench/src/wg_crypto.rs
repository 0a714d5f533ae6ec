//! `gatehouse bench wg-crypto`: WireGuard's packet AEAD on one core, the
//! batched engine (gatehouse-mbx: ChaCha20 in sixteen lanes, Poly1305 in
//! eight with IFMA) against BoringSSL sealing one packet at a time, per
//! packet size and batch size. Packets of one batch use four different
//! keys, as packets of several peers would.

use std::time::{Duration, Instant};

use boring::aead::{AeadCtx, Algorithm};
use gatehouse_mbx::aead::{SealJob, seal_batch};

/// One measurement.
pub struct Row {
    pub engine: &'static str,
    pub size: usize,
    pub batch: usize,
    pub pps: f64,
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wgcrypto engine={} size={} batch={} pps={:.0}", self.engine, self.size, self.batch, self.pps)
    }
}

const KEYS: usize = 4;

fn keys() -> [[u8; 32]; KEYS] {
    std::array::from_fn(|i| std::array::from_fn(|j| (i * 31 + j * 7) as u8))
}

/// Packets per second sealing `batch` packets of `size` bytes at a time.
fn mb(size: usize, batch: usize, time: Duration) -> f64 {
    let keys = keys();
    let mut data = vec![vec![0x5au8; size]; batch];
    let mut tags = vec![[0u8; 16]; batch];
    let mut counter = 0u64;
    let start = Instant::now();
    let mut sealed = 0u64;
    while start.elapsed() < time {
        for _ in 0..64 {
            let mut jobs: Vec<SealJob<'_>> = data
                .iter_mut()
                .zip(tags.iter_mut())
                .enumerate()
                .map(|(i, (d, t))| SealJob { key: &keys[i % KEYS], counter: counter + i as u64, data: d, tag: t })
                .collect();
            seal_batch(&mut jobs);
            counter += batch as u64;
            sealed += batch as u64;
        }
    }
    sealed as f64 / start.elapsed().as_secs_f64()
}

/// The same work through BoringSSL, one packet at a time (one context per
/// key, made once).
fn boring(size: usize, batch: usize, time: Duration) -> Result<f64, boring::error::ErrorStack> {
    let alg = Algorithm::chacha20_poly1305();
    let mut ctxs: Vec<AeadCtx> = keys().iter().map(|k| AeadCtx::new_default_tag(&alg, k)).collect::<Result<_, _>>()?;
    let mut data = vec![vec![0x5au8; size]; batch];
    let mut tag = [0u8; 16];
    let mut counter = 0u64;
    let start = Instant::now();
    let mut sealed = 0u64;
    while start.elapsed() < time {
        for _ in 0..64 {
            for (i, d) in data.iter_mut().enumerate() {
                let mut nonce = [0u8; 12];
                nonce[4..].copy_from_slice(&(counter + i as u64).to_le_bytes());
                ctxs[i % KEYS].seal_in_place_mut(&nonce, d, &mut tag, &[])?;
            }
            counter += batch as u64;
            sealed += batch as u64;
        }
    }
    Ok(sealed as f64 / start.elapsed().as_secs_f64())
}

/// Every size and batch, both engines, interleaved.
pub fn run(
    time: Duration,
    sizes: &[usize],
    batches: &[usize],
    mut each: impl FnMut(&Row),
) -> Result<Vec<Row>, boring::error::ErrorStack> {
    let mut rows = Vec::new();
    for &size in sizes {
        for &batch in batches {
            let batch = batch.max(1);
            for engine in ["mb", "boring"] {
                let pps = if engine == "mb" { mb(size, batch, time) } else { boring(size, batch, time)? };
                let row = Row { engine, size, batch, pps };
                each(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}
