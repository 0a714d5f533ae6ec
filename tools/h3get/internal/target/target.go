// Package target is what Gatehouse's quic-go tools (h3get, h3load) are
// pointed at: the server's UDP address and the certificate authority they
// trust.
package target

import (
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

// Parse resolves addr and loads the CAs in the PEM file at ca (none when
// ca is "").
func Parse(addr, ca string) (*net.UDPAddr, *x509.CertPool, error) {
	server, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if ca == "" {
		return server, pool, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, nil, err
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", ca)
	}
	return server, pool, nil
}
