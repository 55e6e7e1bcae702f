// Package harness holds what every baseline server shares: the command-line
// contract the Rust load generator relies on and the per-connection push loop.
package harness

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"time"
)

// Config is the parsed command line.
type Config struct {
	Addr      string        // -addr
	PushSize  int           // -push-size, bytes; 0 disables push mode
	PushEvery time.Duration // -push-every-us
	// Deflate (-deflate) makes the server accept permessage-deflate (RFC
	// 7692) offers. Off by default, so every scenario but the deflate one
	// measures the servers as they are out of the box; each server's main.go
	// says which compression settings it uses.
	Deflate bool
	// TLSCert and TLSKey (-tls-cert, -tls-key: PEM files) make a server that
	// supports it (Listen) serve wss.
	TLSCert, TLSKey string

	payload []byte // shared push payload; libraries only read it
}

// Parse parses the common flags: -addr, -push-size, -push-every-us, -deflate.
func Parse() *Config {
	c := &Config{}
	var everyUS int
	flag.StringVar(&c.Addr, "addr", "127.0.0.1:9001", "listen address host:port")
	flag.IntVar(&c.PushSize, "push-size", 0, "push mode: bytes per server-initiated binary message (0 = off)")
	flag.IntVar(&everyUS, "push-every-us", 500, "push mode: interval between pushes, in microseconds")
	flag.BoolVar(&c.Deflate, "deflate", false, "accept permessage-deflate offers (no context takeover, level 1)")
	flag.StringVar(&c.TLSCert, "tls-cert", "", "wss: certificate chain (PEM), with -tls-key")
	flag.StringVar(&c.TLSKey, "tls-key", "", "wss: private key (PEM), with -tls-cert")
	flag.Parse()
	if c.PushSize < 0 || everyUS <= 0 {
		fmt.Fprintln(os.Stderr, "-push-size must be >= 0 and -push-every-us > 0")
		os.Exit(2)
	}
	c.PushEvery = time.Duration(everyUS) * time.Microsecond
	if c.PushSize > 0 {
		c.payload = make([]byte, c.PushSize)
		for i := range c.payload {
			c.payload[i] = byte(i)
		}
	}
	return c
}

// Pushing reports whether push mode is on.
func (c *Config) Pushing() bool { return c.PushSize > 0 }

// PushLoop sends the push payload through write once per PushEvery until stop
// is closed or a write fails. It returns at once when push mode is off, so
// callers may run it unconditionally with `go`. write must be safe to call
// concurrently with the connection's echo path, and must not keep or modify
// the slice (it is shared by all connections).
//
// A time.Ticker wakes the loop, but the number of messages sent follows the
// clock: each wake-up sends every push that has fallen due since the last one.
// Go's timers cannot wake more often than about once a millisecond on this
// kind of Linux VM (a 500 µs ticker fires ~1000 times a second), so a bare
// ticker would halve the requested rate. Catching up is what tokio's
// interval does by default (MissedTickBehavior::Burst), which the Rust
// servers of the harness use, so both sides push at the same average rate.
func (c *Config) PushLoop(stop <-chan struct{}, write func([]byte) error) {
	if !c.Pushing() {
		return
	}
	next := time.Now().Add(c.PushEvery)
	t := time.NewTicker(c.PushEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for now := time.Now(); !now.Before(next); next = next.Add(c.PushEvery) {
				if write(c.payload) != nil {
					return
				}
			}
		}
	}
}

// Started prints the single startup line to stderr.
func (c *Config) Started(name string) {
	fmt.Fprintf(os.Stderr, "%s: listening on %s (push-size=%d push-every=%s deflate=%t)\n", name, c.Addr, c.PushSize, c.PushEvery, c.Deflate)
}

// Fatal reports a startup error and exits.
func Fatal(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(1)
}

// Listen listens on -addr; with -tls-cert and -tls-key every accepted
// connection is TLS (crypto/tls, its defaults), so a server that takes a
// net.Listener serves wss unchanged.
func (c *Config) Listen(name string) net.Listener {
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		Fatal(name, err)
	}
	if c.TLSCert == "" {
		return ln
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		Fatal(name, err)
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
}

// QuietOnError is a gws server's OnError for the harness. gws's default
// logs every failed request and, when the request cannot even be read
// (e.g. the runner's connect-and-close readiness probe), leaves the socket
// open; this closes it quietly instead. A nil conn is an Accept error,
// after which gws's RunListener retries at once, so it backs off.
func QuietOnError(conn net.Conn, _ error) {
	if conn == nil {
		time.Sleep(5 * time.Millisecond)
		return
	}
	_ = conn.Close()
}
