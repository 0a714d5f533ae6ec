//! What a benchmark says when it cannot run.

/// Why a benchmark could not run: its options do not fit (what was given,
/// what was expected), or a step on this machine failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Invalid(String),
    /// Setting up what is measured failed (in memory: no system call).
    #[error("{0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Failed { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error(transparent)]
    Interface(#[from] gatehouse_l4_io::runtime::InterfaceError),
    #[error(transparent)]
    Tls(#[from] boring::error::ErrorStack),
}

/// Maps an error of step `what` into a [`BenchError::Failed`].
pub(crate) fn failed<W: Into<String>, E: std::error::Error + Send + Sync + 'static>(
    what: W,
) -> impl FnOnce(E) -> BenchError {
    move |e| BenchError::Failed { what: what.into(), source: Box::new(e) }
}
