// h3load is the HTTP/3 load generator of Gatehouse's benchmarks, on
// quic-go: h2load's shape for QUIC, which Debian's h2load is built without.
//
// Streams mode (the default) opens -c connections and keeps -m requests in
// flight on each for -d; handshake mode (-handshake) runs -c workers that
// each dial a new connection (a full handshake, no resumption), send one
// request, read the response and close, over and over. Either way it prints
// one JSON line: requests completed with a 2xx, errors, requests/s, bytes
// of response body, and the 50th and 99th percentile of the time from
// sending a request (or, in handshake mode, from dialling) to the end of
// its response.
//
// Idle mode (-idle) opens -c connections that each make one request and
// then stay idle until a line comes on stdin; then every one of them asks
// again at once (idle.go).
//
// With -tcp, handshake mode runs over TCP instead: Go's crypto/tls (TLS
// 1.3, which offers X25519MLKEM768 first by default) and one HTTP/1.1 GET
// with Connection: close per connection, for full TLS handshakes with the
// key shares browsers send; and streams mode runs HTTP/2 over TLS from Go's
// net/http, one connection per -c, so that a server's HTTP/2 and HTTP/3
// can be compared under one client's way of sending requests.
//
// -rate paces either mode: new connections (handshake mode) or requests
// (streams mode) per second in all, spread evenly over the workers.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/quic-go/quic-go/qlog"

	"gatehouse/tools/h3get/internal/target"
)

type summary struct {
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	Handshakes int     `json:"handshakes"`
	Seconds    float64 `json:"seconds"`
	RPS        float64 `json:"rps"`
	Bytes      int64   `json:"bytes"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	FirstError string  `json:"first_error,omitempty"`
}

// tally is one worker's count, merged at the end so that the hot loop
// takes no lock.
type tally struct {
	ok, failed, handshakes int
	bytes                  int64
	latencies              []time.Duration
	firstError             error
}

// done counts a whole response of n body bytes, begun at began.
func (t *tally) done(n int64, began time.Time) {
	t.ok++
	t.bytes += n
	t.latencies = append(t.latencies, time.Since(began))
}

func (t *tally) fail(err error) {
	t.failed++
	if t.firstError == nil {
		t.firstError = err
	}
}

type load struct {
	server   *net.UDPAddr
	tls      *tls.Config
	quic     *quic.Config
	url      string
	deadline time.Time
	// With -rate: when the first connection starts, and the time between
	// the connections of one worker (0: as fast as the server answers).
	start time.Time
	every time.Duration
	// A request's time limit (0: 5 s).
	timeout time.Duration
	// Read the server's datagram trains whole (-gro).
	gro bool
}

// pacer gives worker i of n its start times: one connection every n/rate
// seconds, the workers staggered so that together they start `rate` a
// second. A worker that fell behind starts at once but does not burst to
// catch up.
func (l *load) pacer(i, n int) func() {
	if l.every == 0 {
		return func() {}
	}
	next := l.start.Add(time.Duration(i) * l.every / time.Duration(n))
	return func() {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		if now := time.Now(); next.Before(now) {
			next = now
		}
		next = next.Add(l.every)
	}
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "server UDP address")
	host := flag.String("host", "localhost", "server name (SNI and :authority)")
	ca := flag.String("ca", "", "PEM file of the CA to trust")
	path := flag.String("path", "/", "request path")
	conns := flag.Int("c", 8, "connections (streams mode) or workers (handshake mode)")
	streams := flag.Int("m", 32, "requests in flight per connection (streams mode)")
	duration := flag.Duration("d", 10*time.Second, "how long to send requests")
	handshake := flag.Bool("handshake", false, "a new connection for every request")
	insecure := flag.Bool("insecure", false, "do not verify the server's certificate (as h2load)")
	curve := flag.String("curve", "", "key share: x25519, x25519mlkem768 or p256 (default: Go's own preference)")
	overTCP := flag.Bool("tcp", false, "over TCP: handshake mode with TLS 1.3 and one HTTP/1.1 GET per connection; streams mode with HTTP/2 over TLS")
	rate := flag.Float64("rate", 0, "new connections (handshake mode) or requests (streams mode) per second in all (default: unpaced)")
	idle := flag.Bool("idle", false, "idle mode: open -c connections, one request each, print {\"ready\": n}, wait for a line on stdin, then one request on every connection (see idle.go)")
	gro := flag.Bool("gro", true, "read the server's datagram trains whole (UDP GRO), as TCP reads its segments; see gro.go")
	flag.Parse()
	if *rate < 0 {
		fail(errors.New("-rate must be a positive number"))
	}

	server, pool, err := target.Parse(*addr, *ca)
	if err != nil {
		fail(err)
	}
	tlsConf := &tls.Config{RootCAs: pool, ServerName: *host, NextProtos: []string{http3.NextProtoH3},
		InsecureSkipVerify: *insecure}
	switch *curve {
	case "":
	case "x25519":
		tlsConf.CurvePreferences = []tls.CurveID{tls.X25519}
	case "x25519mlkem768":
		tlsConf.CurvePreferences = []tls.CurveID{tls.X25519MLKEM768}
	case "p256":
		tlsConf.CurvePreferences = []tls.CurveID{tls.CurveP256}
	default:
		fail(fmt.Errorf("-curve %q: expected x25519, x25519mlkem768 or p256", *curve))
	}
	port := server.Port
	quicConf := &quic.Config{MaxIdleTimeout: 30 * time.Second}
	if os.Getenv("QLOGDIR") != "" {
		// A qlog of every connection (bench/h3_frames.py reads them). It
		// slows the client: no figure of a traced run is a cost.
		quicConf.Tracer = qlog.DefaultConnectionTracer
	}
	l := &load{
		server: server,
		tls:    tlsConf,
		quic:   quicConf,
		url:    fmt.Sprintf("https://%s:%d%s", *host, port, *path),
		gro:    *gro,
	}

	if *idle {
		if *handshake || *overTCP {
			fail(errors.New("-idle takes neither -handshake nor -tcp"))
		}
		l.idle(*conns)
		return
	}
	start := time.Now()
	l.deadline = start.Add(*duration)
	l.start = start
	// Each worker's share of the rate: a connection (handshake mode) or a
	// stream (streams mode) is a worker.
	workers := *conns
	if !*handshake {
		workers *= *streams
	}
	if *rate > 0 {
		l.every = time.Duration(float64(workers) / *rate * float64(time.Second))
	}
	var tallies []*tally
	var wg sync.WaitGroup
	// spawn runs work on a goroutine of its own with a tally of its own.
	spawn := func(work func(t *tally)) {
		t := &tally{}
		tallies = append(tallies, t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(t)
		}()
	}
	// streamsOn starts connection i's -m request loops on rt; gone says
	// whether that connection has closed.
	streamsOn := func(i int, rt http.RoundTripper, gone func() bool) {
		for j := 0; j < *streams; j++ {
			pace := l.pacer(i*(*streams)+j, workers)
			spawn(func(t *tally) { l.requests(rt, gone, pace, t) })
		}
	}
	switch {
	case *overTCP && *handshake:
		tcpConf := tlsConf.Clone()
		tcpConf.NextProtos = []string{"http/1.1"}
		tcpConf.MinVersion = tls.VersionTLS13
		tcpConf.ClientSessionCache = nil
		request := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", *path, *host)
		for i := 0; i < *conns; i++ {
			pace := l.pacer(i, workers)
			spawn(func(t *tally) { l.tcpHandshakes(server.String(), tcpConf, request, pace, t) })
		}
	case *overTCP:
		for i := 0; i < *conns; i++ {
			tr := h2transport(server.String(), tlsConf)
			defer tr.CloseIdleConnections()
			// net/http dials again if the connection drops.
			streamsOn(i, tr, func() bool { return false })
		}
	default:
		for i := 0; i < *conns; i++ {
			tr, err := l.transport()
			if err != nil {
				fail(err)
			}
			defer tr.Close()
			if *handshake {
				pace := l.pacer(i, workers)
				spawn(func(t *tally) { l.handshakes(tr, pace, t) })
				continue
			}
			conn, err := tr.Dial(context.Background(), server, tlsConf, l.quic)
			if err != nil {
				fail(fmt.Errorf("dial: %w", err))
			}
			defer conn.CloseWithError(0, "")
			cc := (&http3.Transport{}).NewClientConn(conn)
			streamsOn(i, cc, func() bool { return cc.Context().Err() != nil })
		}
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()

	var all tally
	var lat []time.Duration
	for _, t := range tallies {
		all.ok += t.ok
		all.failed += t.failed
		all.handshakes += t.handshakes
		all.bytes += t.bytes
		lat = append(lat, t.latencies...)
		if all.firstError == nil {
			all.firstError = t.firstError
		}
	}
	slices.Sort(lat)
	s := summary{Requests: all.ok, Errors: all.failed, Handshakes: all.handshakes, Seconds: elapsed,
		RPS: float64(all.ok) / elapsed, Bytes: all.bytes, P50ms: quantile(lat, 0.50), P99ms: quantile(lat, 0.99)}
	if all.firstError != nil {
		s.FirstError = all.firstError.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(s)
}

// requests sends one request after another on a shared connection, as
// paced; gone says whether the connection has closed.
func (l *load) requests(rt http.RoundTripper, gone func() bool, pace func(), t *tally) {
	for time.Now().Before(l.deadline) {
		if pace(); !time.Now().Before(l.deadline) {
			break
		}
		began := time.Now()
		n, err := l.get(rt)
		if err != nil {
			t.fail(err)
			if errors.Is(err, net.ErrClosed) || gone() {
				return // the connection is gone: no point in spinning
			}
			continue
		}
		t.done(n, began)
	}
}

// handshakes dials, sends one request and closes, over and over.
func (l *load) handshakes(tr *quic.Transport, pace func(), t *tally) {
	for time.Now().Before(l.deadline) {
		if pace(); !time.Now().Before(l.deadline) {
			break
		}
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := tr.Dial(ctx, l.server, l.tls, l.quic)
		cancel()
		if err != nil {
			t.fail(fmt.Errorf("dial: %w", err))
			continue
		}
		t.handshakes++
		n, err := l.get((&http3.Transport{}).NewClientConn(conn))
		_ = conn.CloseWithError(0, "")
		if err != nil {
			t.fail(err)
			continue
		}
		t.done(n, began)
	}
}

// tcpHandshakes dials TCP, shakes hands, sends one GET and reads the
// answer to its end, over and over.
func (l *load) tcpHandshakes(addr string, conf *tls.Config, request string, pace func(), t *tally) {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	for time.Now().Before(l.deadline) {
		if pace(); !time.Now().Before(l.deadline) {
			break
		}
		began := time.Now()
		conn, err := tls.DialWithDialer(dialer, "tcp", addr, conf)
		if err != nil {
			t.fail(fmt.Errorf("dial: %w", err))
			continue
		}
		t.handshakes++
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.WriteString(conn, request)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(conn)
		}
		_ = conn.Close()
		if err == nil && !strings.HasPrefix(string(body), "HTTP/1.1 200") {
			err = fmt.Errorf("answer %.40q", body)
		}
		if err != nil {
			t.fail(err)
			continue
		}
		t.done(int64(len(body)), began)
	}
}

// h2transport is one HTTP/2-over-TLS connection's worth of Go's net/http:
// every request of the transport shares its one connection to addr.
func h2transport(addr string, conf *tls.Config) *http.Transport {
	h2 := conf.Clone()
	h2.NextProtos = []string{"h2"}
	protocols := new(http.Protocols)
	protocols.SetHTTP2(true)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{
		TLSClientConfig: h2,
		Protocols:       protocols,
		MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
	}
}

func (l *load) get(cc http.RoundTripper) (int64, error) {
	limit := l.timeout
	if limit == 0 {
		limit = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return n, err
	}
	if resp.StatusCode/100 != 2 {
		return n, fmt.Errorf("status %d", resp.StatusCode)
	}
	return n, nil
}

func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(float64(len(sorted))*q))
	return float64(sorted[i].Microseconds()) / 1000
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "h3load:", err)
	os.Exit(1)
}
