// h3get is an HTTP/3 client on quic-go, the second independent client of
// Gatehouse's HTTP/3 tests (aioquic is the first). It sends -n requests at
// once on one connection, optionally with a body, and prints one JSON line
// per response: status, protocol, body length and SHA-256, headers. With
// -migrate it then moves the connection to a new local UDP port (a path
// probed and switched to, as a phone does between networks) and sends
// another round on the same connection.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"gatehouse/tools/h3get/internal/target"
	"github.com/quic-go/quic-go/qlog"
)

type result struct {
	Round   int               `json:"round"`
	Index   int               `json:"index"`
	Status  int               `json:"status"`
	Proto   string            `json:"proto"`
	Len     int64             `json:"len"`
	SHA256  string            `json:"sha256"`
	Headers map[string]string `json:"headers"`
	Error   string            `json:"error,omitempty"`
	Local   string            `json:"local"`
}

// pattern is the tests' deterministic body: SHA-256("gatehouse") repeated.
func pattern(n int) []byte {
	sum := sha256.Sum256([]byte("gatehouse"))
	block := bytes.Repeat(sum[:], 2048)
	out := make([]byte, 0, n)
	for len(out) < n {
		out = append(out, block[:min(len(block), n-len(out))]...)
	}
	return out
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "server UDP address")
	host := flag.String("host", "a.test", "server name (SNI and :authority)")
	ca := flag.String("ca", "", "PEM file of the CA to trust")
	path := flag.String("path", "/", "request path")
	method := flag.String("method", "GET", "request method")
	bodySize := flag.Int("body", 0, "send a body of this many bytes")
	n := flag.Int("n", 1, "requests at once on the connection")
	migrate := flag.Bool("migrate", false, "then move to a new local port and send another round")
	timeout := flag.Duration("timeout", 30*time.Second, "whole run")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	server, pool, err := target.Parse(*addr, *ca)
	if err != nil {
		fail(err)
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fail(err)
	}
	tr := &quic.Transport{Conn: udp}
	var conn *quic.Conn
	h3 := &http3.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: *host},
		// With QLOGDIR set, a qlog of the connection for debugging.
		QUICConfig: &quic.Config{Tracer: qlog.DefaultConnectionTracer},
		Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			c, err := tr.Dial(ctx, server, tlsCfg, cfg)
			conn = c
			return c, err
		},
	}
	defer h3.Close()
	client := &http.Client{Transport: h3}
	url := fmt.Sprintf("https://%s%s", *host, *path)
	if _, port, err := net.SplitHostPort(*addr); err == nil {
		url = fmt.Sprintf("https://%s:%s%s", *host, port, *path)
	}
	var body []byte
	if *bodySize > 0 {
		body = pattern(*bodySize)
	}

	round(ctx, client, 0, *n, *method, url, body, udp.LocalAddr().String())
	if *migrate {
		udp2, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			fail(err)
		}
		p, err := conn.AddPath(&quic.Transport{Conn: udp2})
		if err != nil {
			fail(fmt.Errorf("add path: %w", err))
		}
		if err := p.Probe(ctx); err != nil {
			fail(fmt.Errorf("probe: %w", err))
		}
		if err := p.Switch(); err != nil {
			fail(fmt.Errorf("switch: %w", err))
		}
		round(ctx, client, 1, *n, *method, url, body, udp2.LocalAddr().String())
	}
}

func round(ctx context.Context, client *http.Client, r, n int, method, url string, body []byte, local string) {
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = one(ctx, client, method, url, body)
			results[i].Round, results[i].Index, results[i].Local = r, i, local
		}(i)
	}
	wg.Wait()
	enc := json.NewEncoder(os.Stdout)
	for _, res := range results {
		_ = enc.Encode(res)
	}
}

func one(ctx context.Context, client *http.Client, method, url string, body []byte) result {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return result{Error: err.Error()}
	}
	if body != nil {
		req.ContentLength = int64(len(body))
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer resp.Body.Close()
	h := sha256.New()
	got, err := io.Copy(h, resp.Body)
	res := result{Status: resp.StatusCode, Proto: resp.Proto, Len: got, SHA256: hex.EncodeToString(h.Sum(nil)), Headers: map[string]string{}}
	for k, v := range resp.Header {
		res.Headers[k] = v[0]
	}
	if err != nil {
		res.Error = err.Error()
	}
	return res
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "h3get:", err)
	os.Exit(1)
}
