//! Errors that cross the plane's modules.

/// An error from a body, as hyper's bodies carry them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a client's request body could not be passed on.
#[derive(Debug)]
pub enum ClientBodyError {
    /// It went past `http.max_body_bytes` (the client gets 413).
    TooLarge,
    /// It was malformed or cut off (the client gets 400).
    Read(crate::BoxError),
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBodyError::TooLarge => f.write_str("request body over the configured limit"),
            ClientBodyError::Read(e) => write!(f, "request body: {e}"),
        }
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientBodyError::TooLarge => None,
            ClientBodyError::Read(e) => Some(e.as_ref()),
        }
    }
}
