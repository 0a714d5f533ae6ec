//! Socket options that neither std nor socket2 set. Every `unsafe` block
//! of the crate outside [`crate::ssl_ffi`] is here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// Lets the kernel hand over a new connection only once its first bytes
/// have arrived (or after one SYN-ACK retransmission, about a second, for
/// a client that sends nothing), as HAProxy's `defer-accept` and NGINX's
/// `deferred` do. HTTP and TLS clients speak first, so the first read of
/// an accepted connection finds its request or ClientHello: no wake-up
/// and no empty read between the accept and the data.
pub fn defer_accept(socket: &impl AsRawFd) -> io::Result<()> {
    let seconds: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from a live local; the descriptor
    // is borrowed from a live socket for the call.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_deferred_connection_is_accepted_with_its_first_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
        super::defer_accept(&listener).expect("sets TCP_DEFER_ACCEPT");
        listener.set_nonblocking(true).expect("non-blocking");
        let mut client = TcpStream::connect(listener.local_addr().expect("address")).expect("connects");
        // Connected, nothing sent: nothing to accept yet.
        assert_eq!(listener.accept().err().map(|e| e.kind()), Some(std::io::ErrorKind::WouldBlock));
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("sends");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (mut conn, _) = loop {
            match listener.accept() {
                Ok(c) => break c,
                Err(_) if std::time::Instant::now() < deadline => std::thread::yield_now(),
                Err(e) => panic!("never accepted: {e}"),
            }
        };
        conn.set_nonblocking(false).expect("blocking");
        let mut first = [0u8; 3];
        conn.read_exact(&mut first).expect("the request is there");
        assert_eq!(&first, b"GET");
    }
}
