package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"syscall"
	"testing"
)

// udpSegment is Linux's UDP_SEGMENT (linux/udp.h): a send cut by the
// kernel into datagrams of the given size, as a QUIC server's GSO sends.
const udpSegment = 103

// gsoControl is a UDP_SEGMENT control message for a 64-bit Linux, whose
// cmsghdr is a 64-bit length and two 32-bit fields.
func gsoControl(size uint16) []byte {
	oob := make([]byte, syscall.CmsgSpace(2))
	binary.NativeEndian.PutUint64(oob[0:], uint64(syscall.CmsgLen(2)))
	binary.NativeEndian.PutUint32(oob[8:], syscall.IPPROTO_UDP)
	binary.NativeEndian.PutUint32(oob[12:], udpSegment)
	binary.NativeEndian.PutUint16(oob[16:], size)
	return oob
}

func loopback(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestATrainIsReadWholeAndGivenOutADatagramAtATime(t *testing.T) {
	receiver := loopback(t)
	pc := withGRO(receiver)
	g, ok := pc.(*groConn)
	if !ok {
		t.Fatal("the kernel refused UDP_GRO on a loopback socket")
	}
	sender := loopback(t)
	train := make([]byte, 3500)
	for i := range train {
		train[i] = byte(i * 7)
	}
	to := receiver.LocalAddr().(*net.UDPAddr)
	if _, _, err := sender.WriteMsgUDP(train, gsoControl(1400), to); err != nil {
		t.Fatalf("GSO send: %v", err)
	}
	if _, err := sender.WriteTo([]byte("alone"), to); err != nil {
		t.Fatal(err)
	}

	buf := make([]byte, 1500)
	want := [][]byte{train[:1400], train[1400:2800], train[2800:], []byte("alone")}
	for i, w := range want {
		n, from, err := g.ReadFrom(buf)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], w) {
			t.Fatalf("read %d: %d bytes, want %d bytes of the train's datagram", i, n, len(w))
		}
		if from.String() != sender.LocalAddr().String() {
			t.Fatalf("read %d from %v, want %v", i, from, sender.LocalAddr())
		}
		if i == 0 && len(g.pending) != 2100 {
			t.Fatalf("after the first datagram %d bytes of the train are held, want 2100: the train came in pieces", len(g.pending))
		}
	}
}
