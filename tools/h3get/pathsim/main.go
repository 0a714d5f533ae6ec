// pathsim is a network path for tests and benchmarks, in user space
// because the test machines' kernels have no netem: a UDP relay between
// clients and one server whose server-to-client direction is a bottleneck
// link. Packets from the server queue for the link (at most -queue of
// them waiting; more are dropped, as a router's full buffer drops them),
// leave it at -rate bits per second, and arrive -delay later; packets from
// clients take -delay and no queue. Each client address gets its own
// socket towards the server, as behind a NAT.
//
// It prints its listening address on the first line of stdout, then runs
// until SIGTERM or SIGINT and prints one JSON line: packets and bytes the
// server sent, what the bottleneck dropped, and the largest queue seen;
// and the packets the server sent and the bottleneck dropped in each
// second from the first packet, to tell a slow start's losses from a
// steady state's.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

type stats struct {
	ToClient      int64 `json:"to_client_packets"`
	ToClientBytes int64 `json:"to_client_bytes"`
	Dropped       int64 `json:"dropped_packets"`
	MaxQueue      int   `json:"max_queue"`
	ToServer      int64 `json:"to_server_packets"`
	// [packets sent, dropped] in each second from the first packet.
	EachSecond [][2]int64 `json:"to_client_each_second"`
}

// link is one direction: a FIFO served at a fixed rate (none when rate is
// 0), then the delay; it counts what came to it.
type link struct {
	mu       sync.Mutex
	rate     float64 // bits per second; 0: no bottleneck
	delay    time.Duration
	limit    int
	free     time.Time   // when the link finishes what it holds
	leaving  []time.Time // departure times of packets still queued
	packets  int64
	bytes    int64
	dropped  int64
	maxQueue int
	first    time.Time  // the first packet's arrival (bottleneck only)
	seconds  [][2]int64 // [packets, dropped] in each second since first
}

// admit returns when a packet of n bytes arrives at the far end, or false
// when the queue is full and it is dropped.
func (l *link) admit(now time.Time, n int) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.packets++
	l.bytes += int64(n)
	if l.rate == 0 {
		return now.Add(l.delay), true
	}
	// Each second's counts, for the bottleneck only (the JSON line's).
	if l.first.IsZero() {
		l.first = now
	}
	sec := int(now.Sub(l.first) / time.Second)
	for len(l.seconds) <= sec {
		l.seconds = append(l.seconds, [2]int64{})
	}
	l.seconds[sec][0]++
	// Packets that have left the link no longer queue.
	k := 0
	for k < len(l.leaving) && !l.leaving[k].After(now) {
		k++
	}
	l.leaving = l.leaving[k:]
	l.maxQueue = max(l.maxQueue, len(l.leaving))
	if len(l.leaving) >= l.limit {
		l.dropped++
		l.seconds[sec][1]++
		return time.Time{}, false
	}
	start := now
	if l.free.After(start) {
		start = l.free
	}
	l.free = start.Add(time.Duration(float64(n*8) / l.rate * float64(time.Second)))
	l.leaving = append(l.leaving, l.free)
	return l.free.Add(l.delay), true
}

// forward reads datagrams from c until it is closed and queues each one
// the link lets through for delivery, to where route says.
func forward(c net.PacketConn, l *link, q chan<- delivery, route func(from net.Addr) func([]byte)) {
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		at, ok := l.admit(time.Now(), n)
		if !ok {
			continue
		}
		q <- delivery{at, append([]byte(nil), buf[:n]...), route(from)}
	}
}

// deliver sends each packet at its arrival time, in order.
type delivery struct {
	at   time.Time
	data []byte
	send func([]byte)
}

func deliverer(ch <-chan delivery) {
	for d := range ch {
		if wait := time.Until(d.at); wait > 0 {
			time.Sleep(wait)
		}
		d.send(d.data)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "UDP address clients send to")
	to := flag.String("to", "", "the server's UDP address")
	rate := flag.Float64("rate", 50e6, "bits per second of the server-to-client bottleneck")
	delay := flag.Duration("delay", 20*time.Millisecond, "one-way delay, each direction")
	queue := flag.Int("queue", 32, "packets the bottleneck holds; more are dropped")
	flag.Parse()
	server, err := net.ResolveUDPAddr("udp", *to)
	if err != nil || *to == "" {
		fmt.Fprintln(os.Stderr, "pathsim: -to must be the server's host:port")
		os.Exit(2)
	}
	front, err := net.ListenPacket("udp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pathsim:", err)
		os.Exit(1)
	}
	fmt.Println(front.LocalAddr().String())

	down := &link{rate: *rate, delay: *delay, limit: *queue}
	up := &link{delay: *delay}
	downQ := make(chan delivery, 1<<16)
	upQ := make(chan delivery, 1<<16)
	go deliverer(downQ)
	go deliverer(upQ)

	var mu sync.Mutex
	backs := map[string]net.PacketConn{}
	back := func(client net.Addr) net.PacketConn {
		mu.Lock()
		defer mu.Unlock()
		if c, ok := backs[client.String()]; ok {
			return c
		}
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "pathsim:", err)
			os.Exit(1)
		}
		backs[client.String()] = c
		toClient := func(b []byte) { _, _ = front.WriteTo(b, client) }
		go forward(c, down, downQ, func(net.Addr) func([]byte) { return toClient })
		return c
	}
	go forward(front, up, upQ, func(client net.Addr) func([]byte) {
		c := back(client)
		return func(b []byte) { _, _ = c.WriteTo(b, server) }
	})

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	down.mu.Lock()
	up.mu.Lock()
	each := append([][2]int64{}, down.seconds...) // [] rather than null
	out, _ := json.Marshal(stats{down.packets, down.bytes, down.dropped, down.maxQueue, up.packets, each})
	fmt.Println(string(out))
}
