//! A listener's HTTP/3 side as a snapshot holds it: quiche's settings and
//! TLS context for new connections.

use std::sync::{Mutex, MutexGuard};

use gatehouse_config::{HttpSettings, ListenerTls, QuicSettings, RetryPolicy};

use super::http3::QpackLimits;
use super::io::MAX_DATAGRAM;
use crate::downstream::tls::{LoadedCert, TlsError, build_quic_tls};

/// The largest UDP payload quiche takes in.
const RECV_PAYLOAD: usize = 65_535;

/// A listener's HTTP/3 side, built with each snapshot: the certificates
/// and settings new connections get.
pub struct QuicListener {
    config: Mutex<quiche::Config>,
    /// The largest field section a request may have (the server's
    /// SETTINGS_MAX_FIELD_SECTION_SIZE).
    pub max_head: usize,
    /// The QPACK table a client's encoder may fill.
    pub qpack: QpackLimits,
    pub retry: RetryPolicy,
    pub max_streams: u64,
}

impl QuicListener {
    pub fn build(tls: &ListenerTls, certs: &[LoadedCert], http: &HttpSettings) -> Result<QuicListener, TlsError> {
        let q: &QuicSettings = &http.quic;
        let ctx = build_quic_tls(tls, certs, q.early_data)?;
        let quic_err = |e: quiche::Error| TlsError::Quic(e.to_string());
        let mut c = quiche::Config::with_boring_ssl_ctx_builder(quiche::PROTOCOL_VERSION, ctx).map_err(quic_err)?;
        c.set_application_protos(&[b"h3"]).map_err(quic_err)?;
        c.set_max_idle_timeout(http.client_idle_timeout.as_millis() as u64);
        c.set_max_recv_udp_payload_size(RECV_PAYLOAD);
        c.set_max_send_udp_payload_size(MAX_DATAGRAM);
        // Path MTU discovery (RFC 8899) finds what the path carries, up to
        // MAX_DATAGRAM, as quic-go and Chrome do: no fixed guess that is
        // too large for a tunnel or too small for an Ethernet path.
        c.discover_pmtu(true);
        c.set_initial_max_data(q.connection_window);
        c.set_initial_max_stream_data_bidi_remote(q.stream_window);
        c.set_initial_max_stream_data_bidi_local(q.stream_window);
        // The client's control and QPACK streams carry little.
        c.set_initial_max_stream_data_uni(64 * 1024);
        c.set_initial_max_streams_bidi(q.max_streams);
        c.set_initial_max_streams_uni(8);
        c.set_max_connection_window(q.connection_window);
        c.set_max_stream_window(q.stream_window);
        // quiche keeps a path per client address, and a path a client left
        // by NAT rebinding keeps its connection ID, so this bounds how
        // often one connection can change address (seven times).
        c.set_active_connection_id_limit(8);
        c.set_disable_active_migration(false);
        if q.early_data {
            c.enable_early_data();
        }
        Ok(QuicListener {
            config: Mutex::new(c),
            max_head: http.max_header_bytes,
            qpack: QpackLimits { capacity: q.qpack_table_capacity, blocked_streams: q.qpack_blocked_streams },
            retry: q.retry,
            max_streams: q.max_streams,
        })
    }

    pub fn config(&self) -> MutexGuard<'_, quiche::Config> {
        self.config.lock().unwrap_or_else(|e| e.into_inner())
    }
}
