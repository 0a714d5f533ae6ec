package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// idleConn is one connection of idle mode, with its own UDP socket (as
// separate clients have).
type idleConn struct {
	tr *quic.Transport
	cc *http3.ClientConn
	qc *quic.Conn
}

// idleReport is idle mode's second line: how the request on every idle
// connection went.
type idleReport struct {
	Answered   int    `json:"answered"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// idle opens n connections, each makes one request and then stays idle.
// It prints {"ready": n} when all are open, waits for a line on stdin (or
// its end), then sends one request on every connection at once, prints
// how many were answered with a 2xx and closes them all: the client of
// bench/idle_memory.py's HTTP/3 row.
func (l *load) idle(n int) {
	// Thousands of requests at once measure memory, not latency: a server
	// on one core may take longer than the usual 5 s to answer them all.
	l.timeout = time.Minute
	conns := make([]*idleConn, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := l.dialIdle()
			if err == nil {
				_, err = l.get(c.cc)
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if firstErr != nil {
		fail(fmt.Errorf("opening %d idle connections: %w", n, firstErr))
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]int{"ready": n})
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')

	var report idleReport
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.get(c.cc)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				report.Errors++
				if report.FirstError == "" {
					report.FirstError = err.Error()
				}
				return
			}
			report.Answered++
		}()
	}
	wg.Wait()
	_ = json.NewEncoder(os.Stdout).Encode(report)
	for _, c := range conns {
		_ = c.qc.CloseWithError(0, "")
		_ = c.tr.Close()
	}
}

func (l *load) dialIdle() (*idleConn, error) {
	tr, err := l.transport()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf := l.quic.Clone()
	// Idle for as long as the run takes; the server's own idle timeout
	// is what the benchmark sets.
	conf.MaxIdleTimeout = 10 * time.Minute
	// A ping every 10 s keeps the connection under a server's shorter
	// idle timeout (quic-go's, Caddy's, is 30 s).
	conf.KeepAlivePeriod = 10 * time.Second
	qc, err := tr.Dial(ctx, l.server, l.tls.Clone(), conf)
	if err != nil {
		_ = tr.Close()
		return nil, fmt.Errorf("dial: %w", err)
	}
	return &idleConn{tr: tr, cc: (&http3.Transport{}).NewClientConn(qc), qc: qc}, nil
}
