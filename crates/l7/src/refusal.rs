//! Every way a request can fail, as a [`Refusal`]: it decides the status
//! code Gatehouse answers with and the access log's reason code, in one
//! place.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::accesslog::reason;
use crate::body::{AnyBody, full};

/// Why a request was answered by Gatehouse itself rather than an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BadRequest(&'static str),
    NoRoute,
    Forbidden,
    RateLimited {
        retry_after: u64,
    },
    BodyTooLarge,
    ClientTimeout,
    NoHealthyEndpoint,
    ConnectFailed,
    ConnectTimeout,
    UpstreamTimeout,
    UpstreamError,
    /// An Upgrade (WebSocket) to a pool spoken to over HTTP/2.
    UpgradeUnsupported,
}

impl Refusal {
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            Refusal::NoRoute => StatusCode::NOT_FOUND,
            Refusal::Forbidden => StatusCode::FORBIDDEN,
            Refusal::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
            Refusal::NoHealthyEndpoint => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::ConnectFailed | Refusal::UpstreamError | Refusal::UpgradeUnsupported => StatusCode::BAD_GATEWAY,
            Refusal::ConnectTimeout | Refusal::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::BadRequest(why) => why,
            Refusal::NoRoute => reason::NO_ROUTE,
            Refusal::Forbidden => reason::ACL_DENIED,
            Refusal::RateLimited { .. } => reason::RATE_LIMITED,
            Refusal::BodyTooLarge => reason::BODY_TOO_LARGE,
            Refusal::ClientTimeout => reason::CLIENT_TIMEOUT,
            Refusal::NoHealthyEndpoint => reason::NO_HEALTHY_ENDPOINT,
            Refusal::ConnectFailed => reason::CONNECT_FAILED,
            Refusal::ConnectTimeout => reason::CONNECT_TIMEOUT,
            Refusal::UpstreamTimeout => reason::UPSTREAM_TIMEOUT,
            Refusal::UpstreamError => reason::UPSTREAM_ERROR,
            Refusal::UpgradeUnsupported => reason::UPGRADE_UNSUPPORTED,
        }
    }

    pub fn response(self) -> Response<AnyBody> {
        let status = self.status();
        let text = format!("{} {}\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
        let mut resp = Response::new(full(text));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Refusal::RateLimited { retry_after } = self {
            h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        if matches!(self, Refusal::BadRequest(_) | Refusal::ClientTimeout | Refusal::BodyTooLarge) {
            // The rest of this connection's byte stream can't be trusted.
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}
