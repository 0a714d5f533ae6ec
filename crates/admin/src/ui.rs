//! The dashboard at `/ui/`: a few static files compiled into the binary,
//! polling `/stats` and writing through the admin API.
//!
//! Every file is served with a strong `ETag` (a hash of its bytes, so a
//! browser revalidates with `If-None-Match` and gets 304), `Cache-Control:
//! no-cache`, and a `Content-Security-Policy` that allows nothing but this
//! origin: no inline script or style, no third-party request, no framing.

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::Full;

use crate::{Body, error, not_allowed};

/// The page may load and fetch only from its own origin; nothing inline.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset { path: "index.html", content_type: "text/html; charset=utf-8", bytes: include_bytes!("../ui/index.html") },
    Asset { path: "app.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../ui/app.js") },
    Asset { path: "app.css", content_type: "text/css; charset=utf-8", bytes: include_bytes!("../ui/app.css") },
    Asset { path: "favicon.svg", content_type: "image/svg+xml", bytes: include_bytes!("../ui/favicon.svg") },
    Asset {
        path: "vendor/uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../ui/vendor/uPlot.iife.min.js"),
    },
    Asset {
        path: "vendor/uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../ui/vendor/uPlot.min.css"),
    },
    Asset {
        path: "vendor/uPlot.LICENSE",
        content_type: "text/plain; charset=utf-8",
        bytes: include_bytes!("../ui/vendor/uPlot.LICENSE"),
    },
];

/// Each asset's ETag, computed once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                // The hasher's keys are fixed, so the tag is the same in
                // every process of a build: a takeover keeps caches valid.
                let mut h = std::hash::DefaultHasher::new();
                a.bytes.hash(&mut h);
                env!("CARGO_PKG_VERSION").hash(&mut h);
                format!("\"{:016x}\"", h.finish())
            })
            .collect()
    })
}

/// Headers every dashboard response carries, errors included.
fn harden(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

fn redirect(to: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
    r.headers_mut().insert(header::LOCATION, HeaderValue::from_static(to));
    r
}

/// Answers `path` (`/`, `/ui` or under `/ui/`).
pub fn serve(method: &Method, path: &str, if_none_match: Option<&HeaderValue>) -> Response<Body> {
    let mut r = respond(method, path, if_none_match);
    harden(r.headers_mut());
    r
}

fn respond(method: &Method, path: &str, if_none_match: Option<&HeaderValue>) -> Response<Body> {
    if path == "/" || path == "/ui" {
        return redirect("/ui/");
    }
    if method != Method::GET && method != Method::HEAD {
        return not_allowed("GET, HEAD");
    }
    let name = path.strip_prefix("/ui/").map(|p| if p.is_empty() { "index.html" } else { p });
    let Some((i, asset)) = name.and_then(|n| ASSETS.iter().enumerate().find(|(_, a)| a.path == n)) else {
        return error(StatusCode::NOT_FOUND, format!("no dashboard file at {path}"));
    };
    let tag = &etags()[i];
    let fresh = if_none_match
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().trim_start_matches("W/") == tag || t.trim() == "*"));
    let mut r = if fresh {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Full::new(Bytes::from_static(asset.bytes)));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
        r
    };
    if let Ok(v) = HeaderValue::from_str(tag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_have_etags_and_revalidate() {
        let r = serve(&Method::GET, "/ui/", None);
        assert_eq!(r.status(), StatusCode::OK);
        let tag = r.headers().get(header::ETAG).expect("etag").clone();
        assert!(r.headers()[header::CONTENT_TYPE].to_str().expect("ascii").starts_with("text/html"));
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        let again = serve(&Method::GET, "/ui/index.html", Some(&tag));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let other = serve(&Method::GET, "/ui/app.js", Some(&tag));
        assert_eq!(other.status(), StatusCode::OK, "another file's tag does not match");
        assert_ne!(other.headers()[header::ETAG], tag);
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        assert_eq!(serve(&Method::GET, "/ui/../Cargo.toml", None).status(), StatusCode::NOT_FOUND);
        assert_eq!(serve(&Method::GET, "/ui/vendor/", None).status(), StatusCode::NOT_FOUND);
        assert_eq!(serve(&Method::POST, "/ui/", None).status(), StatusCode::METHOD_NOT_ALLOWED);
        let r = serve(&Method::GET, "/", None);
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.headers()[header::LOCATION], "/ui/");
    }

    #[test]
    fn the_page_loads_nothing_inline_or_from_elsewhere() {
        let html = std::str::from_utf8(ASSETS[0].bytes).expect("utf-8");
        assert!(!html.contains("<script>") && !html.contains("style="), "inline code is refused by the CSP");
        assert!(!html.contains("http://") && !html.contains("https://"), "no third-party request");
        for a in ASSETS.iter().filter(|a| a.path.ends_with(".js") && !a.path.starts_with("vendor/")) {
            let js = std::str::from_utf8(a.bytes).expect("utf-8");
            assert!(!js.contains("innerHTML"), "{}: text goes in with textContent", a.path);
            assert!(!js.contains("eval("), "{}", a.path);
        }
    }
}
