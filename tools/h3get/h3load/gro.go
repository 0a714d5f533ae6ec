package main

import (
	"encoding/binary"
	"net"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// udpGRO is Linux's UDP_GRO socket option (linux/udp.h), which the syscall
// package does not name: on it, a read hands over a whole train of
// same-size datagrams from one sender, and a control message gives the size.
const udpGRO = 104

// groConn is a UDP socket read with generic receive offload, for quic-go as
// a plain net.PacketConn.
//
// Why: on loopback a server's UDP GSO train reaches the client's socket as
// one buffer, and a socket without GRO makes the kernel cut it into
// datagrams and queue each one, in the sending server's context, so the
// client's per-datagram receive work is billed to the server being
// measured. Over a NIC that work is the client machine's. TCP on loopback
// has no such cost (its 64 KiB segments reach the client whole), so
// without GRO an HTTP/3 server would be charged for its client where an
// HTTP/2 server is not. With it, each train is read in one call and given
// out here one datagram at a time.
//
// quic-go reads a plain PacketConn one datagram per ReadFrom from a single
// goroutine, and sends one datagram per WriteTo (no GSO from the client,
// whose packets are requests and ACKs).
type groConn struct {
	conn *net.UDPConn
	buf  []byte
	oob  []byte
	// The rest of the last train read, its segment size and its sender.
	pending []byte
	segment int
	from    *net.UDPAddr
}

// transport is a client's QUIC transport on a loopback UDP socket of its
// own, read with GRO unless -gro=false.
func (l *load) transport() (*quic.Transport, error) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	var pc net.PacketConn = udp
	if l.gro {
		pc = withGRO(udp)
	}
	return &quic.Transport{Conn: pc}, nil
}

// withGRO turns GRO on for conn; when the kernel refuses it, conn as it is.
func withGRO(conn *net.UDPConn) net.PacketConn {
	raw, err := conn.SyscallConn()
	if err != nil {
		return conn
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_UDP, udpGRO, 1)
	}); err != nil || serr != nil {
		return conn
	}
	return &groConn{conn: conn, buf: make([]byte, 65536), oob: make([]byte, 128)}
}

func (g *groConn) ReadFrom(p []byte) (int, net.Addr, error) {
	if len(g.pending) == 0 {
		n, oobn, _, from, err := g.conn.ReadMsgUDP(g.buf, g.oob)
		if err != nil {
			return 0, nil, err
		}
		g.pending, g.segment, g.from = g.buf[:n], n, from
		if size := groSegment(g.oob[:oobn]); size > 0 {
			g.segment = size
		}
	}
	k := min(g.segment, len(g.pending))
	n := copy(p, g.pending[:k])
	g.pending = g.pending[k:]
	return n, g.from, nil
}

// groSegment is the segment size a UDP_GRO control message gives, or 0.
func groSegment(oob []byte) int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.IPPROTO_UDP && m.Header.Type == udpGRO && len(m.Data) >= 4 {
			return int(binary.NativeEndian.Uint32(m.Data))
		}
	}
	return 0
}

func (g *groConn) WriteTo(p []byte, addr net.Addr) (int, error) { return g.conn.WriteTo(p, addr) }
func (g *groConn) Close() error                                 { return g.conn.Close() }
func (g *groConn) LocalAddr() net.Addr                          { return g.conn.LocalAddr() }
func (g *groConn) SetDeadline(t time.Time) error                { return g.conn.SetDeadline(t) }
func (g *groConn) SetReadDeadline(t time.Time) error            { return g.conn.SetReadDeadline(t) }
func (g *groConn) SetWriteDeadline(t time.Time) error           { return g.conn.SetWriteDeadline(t) }
func (g *groConn) SetReadBuffer(n int) error                    { return g.conn.SetReadBuffer(n) }
func (g *groConn) SetWriteBuffer(n int) error                   { return g.conn.SetWriteBuffer(n) }

// SyscallConn lets quic-go set the don't-fragment bit, as on its own UDP
// sockets.
func (g *groConn) SyscallConn() (syscall.RawConn, error) { return g.conn.SyscallConn() }
