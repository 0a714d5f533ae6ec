// soakload is the steady client of Gatehouse's soak (`make soak`): -c
// workers each send requests over HTTP/1.1, HTTP/2 (TLS, ALPN h2) or
// HTTP/3 (quic-go), one at a time with -gap between them, cycling over the
// given paths, until it is stopped. Every second it prints one JSON line:
// per path, the requests answered with a 2xx and the failures by kind (the
// status code, or "timeout", "refused", "reset", "other" for requests that
// got no answer). Connections are kept alive and reopened when they fail,
// as a browser or an API client does.
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
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

type counts struct {
	OK     int            `json:"ok"`
	Failed map[string]int `json:"failed,omitempty"`
}

type report struct {
	Time  int64              `json:"t"`
	Proto string             `json:"proto"`
	Paths map[string]*counts `json:"paths"`
}

type tally struct {
	mu    sync.Mutex
	paths map[string]*counts
}

func (t *tally) add(path, failure string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.paths[path]
	if c == nil {
		c = &counts{Failed: map[string]int{}}
		t.paths[path] = c
	}
	if failure == "" {
		c.OK++
	} else {
		c.Failed[failure]++
	}
}

func (t *tally) take() map[string]*counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.paths
	t.paths = map[string]*counts{}
	return out
}

// kind names a request that got no answer.
func kind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "reset"
	}
	return "other"
}

func client(proto string, timeout time.Duration) (*http.Client, error) {
	tlsConf := &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"}
	switch proto {
	case "h1":
		return &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: tlsConf}}, nil
	case "h2":
		tr := &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: tlsConf, ForceAttemptHTTP2: true}
		tr.TLSClientConfig.NextProtos = []string{"h2"}
		return &http.Client{Timeout: timeout, Transport: tr}, nil
	case "h3":
		tlsConf.NextProtos = []string{http3.NextProtoH3}
		tr := &http3.Transport{TLSClientConfig: tlsConf, QUICConfig: &quic.Config{MaxIdleTimeout: 30 * time.Second}}
		return &http.Client{Timeout: timeout, Transport: tr}, nil
	}
	return nil, fmt.Errorf("unknown protocol %q (h1, h2 or h3)", proto)
}

func main() {
	proto := flag.String("proto", "h1", "h1, h2 or h3")
	base := flag.String("url", "", "the base URL, e.g. https://127.0.0.1:8443")
	paths := flag.String("paths", "/", "comma-separated paths, cycled over")
	workers := flag.Int("c", 4, "workers, each with one request in flight")
	gap := flag.Duration("gap", 20*time.Millisecond, "pause between a worker's requests")
	timeout := flag.Duration("timeout", 5*time.Second, "a request's deadline")
	flag.Parse()
	hc, err := client(*proto, *timeout)
	if err != nil || *base == "" {
		fmt.Fprintln(os.Stderr, "soakload: -url is needed;", err)
		os.Exit(2)
	}
	list := strings.Split(*paths, ",")
	t := &tally{paths: map[string]*counts{}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i++ {
				path := list[i%len(list)]
				resp, err := hc.Get(*base + path)
				switch {
				case err != nil && ctx.Err() != nil:
					return
				case err != nil:
					t.add(path, kind(err))
				default:
					_, rerr := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch {
					case rerr != nil:
						t.add(path, kind(rerr))
					case resp.StatusCode >= 200 && resp.StatusCode < 300:
						t.add(path, "")
					default:
						t.add(path, fmt.Sprint(resp.StatusCode))
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(*gap):
				}
			}
		}(w)
	}
	enc := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			_ = enc.Encode(report{Time: time.Now().Unix(), Proto: *proto, Paths: t.take()})
			return
		case now := <-tick.C:
			_ = enc.Encode(report{Time: now.Unix(), Proto: *proto, Paths: t.take()})
		}
	}
}
