//! The batch call: up to eight raw RSA private operations checked,
//! packed into lanes, run by the engine and unpacked, each with its own
//! result.

use std::fmt;

use crate::bn::limbs_from_be;
use crate::engine::{self, Fault};
use crate::ifma::LANES;
use crate::rsa::RsaKey;

/// Operations in one batch, one per 64-bit lane of a 512-bit register.
pub const BATCH: usize = LANES;

/// Why one operation of a batch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpError {
    /// This CPU has no AVX-512 IFMA.
    Unsupported,
    /// The input is not as long as the modulus.
    InputLength { expected: usize, got: usize },
    /// The input, as a number, is not below the modulus.
    InputTooLarge,
    /// The output buffer is not as long as the modulus.
    OutputLength { expected: usize, got: usize },
    /// The key is of another class than the batch's first key.
    MixedBatch,
    /// More than [`BATCH`] operations were passed.
    BatchFull,
    /// The result failed the public-key check and was discarded.
    Fault,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported => f.write_str("CPU has no AVX-512 IFMA"),
            Self::InputLength { expected, got } => {
                write!(f, "input is {got} bytes, the modulus {expected}")
            }
            Self::InputTooLarge => f.write_str("input is not below the modulus"),
            Self::OutputLength { expected, got } => {
                write!(f, "output buffer is {got} bytes, the modulus {expected}")
            }
            Self::MixedBatch => f.write_str("key size differs from the batch's"),
            Self::BatchFull => write!(f, "more than {BATCH} operations in one batch"),
            Self::Fault => f.write_str("result failed the public-key check"),
        }
    }
}

impl std::error::Error for OpError {}

/// One private-key operation: `output = input^d mod n`, both as long as the modulus.
pub struct Op<'a> {
    pub key: &'a RsaKey,
    pub input: &'a [u8],
    pub output: &'a mut [u8],
}

/// Runs up to [`BATCH`] raw RSA private operations at once (the caller pads for
/// signatures and unpads after decryption). Keys may differ but must share a
/// class. Result `i` belongs to `ops[i]`; a failed operation leaves its output
/// zeroed, and a result that fails the public-key check is never written.
pub fn private_batch(ops: &mut [Op<'_>]) -> Vec<Result<(), OpError>> {
    private_batch_with_fault(ops, None)
}

/// [`private_batch`] with a fault injected into one lane's result before the
/// public-key check, to test that the check catches it.
#[doc(hidden)]
pub fn private_batch_with_fault(ops: &mut [Op<'_>], fault: Option<Fault>) -> Vec<Result<(), OpError>> {
    let mut results: Vec<Result<(), OpError>> = Vec::with_capacity(ops.len());
    let Some(class) = ops.first().map(|op| op.key.class()) else {
        return results;
    };
    let limbs = class.modulus_limbs();
    let supported = engine::available();
    let mut lanes: Vec<usize> = Vec::with_capacity(BATCH);
    let mut keys: Vec<&RsaKey> = Vec::with_capacity(BATCH);
    let mut inputs: Vec<Vec<u64>> = Vec::with_capacity(BATCH);
    let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(BATCH);
    for (i, op) in ops.iter_mut().enumerate() {
        op.output.fill(0);
        let size = op.key.size();
        let checked = if !supported {
            Err(OpError::Unsupported)
        } else if i >= BATCH {
            Err(OpError::BatchFull)
        } else if op.key.class() != class {
            Err(OpError::MixedBatch)
        } else if op.input.len() != size {
            Err(OpError::InputLength { expected: size, got: op.input.len() })
        } else if op.output.len() != size {
            Err(OpError::OutputLength { expected: size, got: op.output.len() })
        } else if op.input >= op.key.n_be.as_slice() {
            Err(OpError::InputTooLarge)
        } else {
            limbs_from_be(op.input, limbs).ok_or(OpError::InputTooLarge)
        };
        match checked {
            Ok(limbs) => {
                lanes.push(i);
                keys.push(op.key);
                inputs.push(limbs);
                outputs.push(&mut *op.output);
                results.push(Ok(()));
            }
            Err(e) => results.push(Err(e)),
        }
    }
    if lanes.is_empty() {
        return results;
    }
    let input_refs: Vec<&[u64]> = inputs.iter().map(Vec::as_slice).collect();
    let ok = engine::run(class, &keys, &input_refs, &mut outputs, fault);
    for (lane, &i) in lanes.iter().enumerate() {
        if ok & (1 << lane) == 0 {
            results[i] = Err(OpError::Fault);
        }
    }
    results
}
